-- consume_wake_hint: take one unit of a type's wake budget, if there is one.
--
-- KEYS[1]  the budget key, {prefix}:hint:{type_name}
--
-- Returns 1 when a unit was taken, or when no budget exists (missing or
-- expired, or a value that is not a number): waking is the safe answer.
-- Returns 0 only when a budget exists and is exhausted. DECR keeps the TTL.
local budget = tonumber(redis.call('GET', KEYS[1]))
if budget == nil then
  return 1
end
if budget > 0 then
  redis.call('DECR', KEYS[1])
  return 1
end
return 0
