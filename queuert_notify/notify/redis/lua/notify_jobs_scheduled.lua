-- notify_jobs_scheduled: provide every type's wake budget, then announce each
-- type on the scheduled channel, in one atomic round trip.
--
-- KEYS[i]       the budget key of the i-th type, {prefix}:hint:{type_name}
-- ARGV[1]       the scheduled channel, {prefix}:sched
-- ARGV[2]       time to live of every budget in seconds
-- ARGV[2i + 1]  the i-th type name (the message payload)
-- ARGV[2i + 2]  units to add to the i-th budget (integer > 0)
--
-- Returns the number of types announced. Budgets are written before any
-- PUBLISH so a woken listener always finds its budget; a value that is not a
-- usable budget is replaced, so the announcement always goes out.
for i, key in ipairs(KEYS) do
  usable_budget(key)
  redis.call('INCRBY', key, ARGV[2 * i + 2])
  redis.call('EXPIRE', key, ARGV[2])
end
for i = 1, #KEYS do
  redis.call('PUBLISH', ARGV[1], ARGV[2 * i + 1])
end
return #KEYS
