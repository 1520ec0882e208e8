-- provide_wake_hint: add to a type's wake budget and restart its expiry.
--
-- KEYS[1]  the budget key, {prefix}:hint:{type_name}
-- ARGV[1]  units to add (integer > 0)
-- ARGV[2]  time to live in seconds, counted from this call
--
-- Returns the budget after the addition. Budgets from concurrent callers add
-- up because INCRBY and EXPIRE run as one atomic script. A value that is not a
-- usable budget is replaced.
usable_budget(KEYS[1])
local budget = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return budget
