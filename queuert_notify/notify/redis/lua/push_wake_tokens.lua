-- push_wake_tokens: add wake tokens to the token lists of one or more types, in
-- one atomic round trip (RedisNotifyAdapter(wake="lists")).
--
-- KEYS[2i - 1]  the token list of the i-th type, {prefix}:wake:{type_name}
-- KEYS[2i]      its issue marker, {prefix}:wake:{type_name}:issued
-- ARGV[1]       time to live of the list and the marker, in seconds (from this push)
-- ARGV[2]       the cap: no list holds more tokens than this
-- ARGV[2 + i]   tokens to add for the i-th type (integer > 0)
--
-- Returns the number of tokens pushed over all types. A token is the string "1":
-- one token wakes one worker. Tokens beyond the cap are dropped and the marker
-- says "overflow", so a consumer that finds the list empty wakes anyway (jobs
-- without a token exist) until the marker expires; otherwise the marker says
-- "issued" (an empty list then means every token was taken). A list key holding
-- another type (a stranger's value, a bug) is replaced.
local ttl, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local pushed = 0
for i = 1, #KEYS / 2 do
  local list, marker = KEYS[2 * i - 1], KEYS[2 * i]
  local kind = redis.call('TYPE', list)['ok']
  if kind ~= 'none' and kind ~= 'list' then
    redis.call('DEL', list)
  end
  local wanted = tonumber(ARGV[2 + i])
  local n = math.max(math.min(wanted, cap - redis.call('LLEN', list)), 0)
  local left = n
  while left > 0 do
    -- RPUSH in chunks: unpack() of thousands of arguments overflows Lua's stack.
    local chunk = {}
    for j = 1, math.min(left, 200) do
      chunk[j] = '1'
    end
    redis.call('RPUSH', list, unpack(chunk))
    left = left - #chunk
  end
  if n > 0 or kind == 'list' then
    redis.call('EXPIRE', list, ttl)
  end
  local overflowed = n < wanted
  if not overflowed and redis.call('TYPE', marker)['ok'] == 'string' then
    overflowed = redis.call('GET', marker) == 'overflow'
  end
  redis.call('SET', marker, overflowed and 'overflow' or 'issued', 'EX', ttl)
  pushed = pushed + n
end
return pushed
