-- wake_heartbeat: keep one consumer of wake tokens alive on each of its types, and
-- return the tokens of consumers that stopped (the reaper), atomically per call.
--
-- KEYS[3i - 2]  the consumers of the i-th type, {prefix}:wake:{type_name}:consumers:
--               a sorted set of consumer ids scored by the server time (ms) until
--               which each is alive (its heartbeat)
-- KEYS[3i - 1]  the token list of the i-th type, {prefix}:wake:{type_name}
-- KEYS[3i]      this consumer's processing list of the i-th type
-- ARGV[1]       this consumer's id
-- ARGV[2]       heartbeat timeout in milliseconds
-- ARGV[3]       time to live of token and processing lists, in seconds
-- ARGV[3 + i]   the prefix of the i-th type's processing lists,
--               {prefix}:wake:{type_name}:proc: (same hash slot as KEYS[3i - 2])
--
-- Returns the number of tokens returned to token lists. A consumer whose score
-- passed is dead: every token in its processing list goes back to the head of
-- the token list (next to be taken) and it leaves the set. One script does both,
-- so two reapers never return one token twice.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local consumer, timeout, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local returned = 0
for i = 1, #KEYS / 3 do
  local consumers, list, own = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  if redis.call('TYPE', consumers)['ok'] ~= 'zset' then
    redis.call('DEL', consumers)
  end
  local dead = redis.call('ZRANGEBYSCORE', consumers, '-inf', '(' .. now_ms)
  for _, name in ipairs(dead) do
    if name ~= consumer then
      local proc = ARGV[3 + i] .. name
      if redis.call('TYPE', proc)['ok'] == 'list' then
        while redis.call('LMOVE', proc, list, 'RIGHT', 'LEFT') do
          returned = returned + 1
        end
        redis.call('EXPIRE', list, ttl)
      end
      redis.call('ZREM', consumers, name)
    end
  end
  redis.call('ZADD', consumers, now_ms + timeout, consumer)
  redis.call('PEXPIRE', consumers, ttl * 1000 + timeout)
  redis.call('EXPIRE', own, ttl)
end
return returned
