-- notify_jobs_scheduled_sharded: on a Redis Cluster, provide the wake budgets of
-- types whose names share one hash slot, then announce each type on its own
-- shard channel, in one atomic round trip to the master of that slot.
--
-- KEYS[i]       the budget key of the i-th type, {prefix}:hint:{<type_name>}
-- ARGV[1]       time to live of every budget in seconds
-- ARGV[3i - 1]  the i-th type's shard channel, {prefix}:sched:{<type_name>}
--               (same hash tag as KEYS[i], hence the same slot: a shard channel
--               outside the script's slot would not reach its subscribers)
-- ARGV[3i]      the i-th type name (the message payload)
-- ARGV[3i + 1]  units to add to the i-th budget (integer > 0)
--
-- Returns the number of types announced. Budgets are written before any
-- SPUBLISH so a woken listener always finds its budget; a value that is not a
-- usable budget is replaced, so the announcement always goes out.
for i, key in ipairs(KEYS) do
  usable_budget(key)
  redis.call('INCRBY', key, ARGV[3 * i + 1])
  redis.call('EXPIRE', key, ARGV[1])
end
for i = 1, #KEYS do
  redis.call('SPUBLISH', ARGV[3 * i - 1], ARGV[3 * i])
end
return #KEYS
