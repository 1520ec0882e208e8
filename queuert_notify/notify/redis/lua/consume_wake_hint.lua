-- consume_wake_hint: take one unit of a type's wake budget, if there is one.
--
-- KEYS[1]  the budget key, {prefix}:hint:{type_name}
-- ARGV[1]  time to live of a budget in seconds (restored on a budget that lost it)
--
-- Returns 1 when a unit was taken, or when no budget exists (missing or
-- expired, or a value that is not a usable number, which is deleted): waking is
-- the safe answer. Returns 0 only when a budget exists and is exhausted. DECR
-- keeps the TTL; a budget without one (set by hand) gets it back, so an exhausted
-- budget can never silence a type for good.
local budget = usable_budget(KEYS[1])
if budget == nil then
  return 1
end
if redis.call('TTL', KEYS[1]) < 0 then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
if budget > 0 then
  redis.call('DECR', KEYS[1])
  return 1
end
return 0
