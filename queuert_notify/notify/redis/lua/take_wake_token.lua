-- take_wake_token: consume_wake_hint in lists mode: take one wake token of a type.
--
-- KEYS[1]  the token list, {prefix}:wake:{type_name}
-- KEYS[2]  its issue marker, {prefix}:wake:{type_name}:issued
-- KEYS[3]  optional: this consumer's processing list of the type,
--          {prefix}:wake:{type_name}:proc:{consumer}; the token is moved there
--          (to be acknowledged after the claim) instead of popped
-- ARGV[1]  time to live of the processing list in seconds (with KEYS[3])
--
-- Returns {code, length of KEYS[3] (0 without it)}. code 2: a token was moved into
-- KEYS[3]; 1: a token was popped, or none is left but none was issued within the
-- TTL (or the list overflowed, or held a value of another type, which is deleted):
-- wake rather than miss; 0 only when tokens were issued lately and every one is
-- taken (the length then tells the caller whether a token it has not heard of yet
-- is already on its way to it).
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'list' then
  if KEYS[3] then
    if redis.call('LMOVE', KEYS[1], KEYS[3], 'LEFT', 'RIGHT') then
      redis.call('EXPIRE', KEYS[3], ARGV[1])
      return {2, 0}
    end
  elseif redis.call('LPOP', KEYS[1]) then
    return {1, 0}
  end
elseif kind ~= 'none' then
  redis.call('DEL', KEYS[1])
  return {1, 0}
end
if redis.call('TYPE', KEYS[2])['ok'] == 'string' and redis.call('GET', KEYS[2]) == 'issued' then
  return {0, KEYS[3] and redis.call('LLEN', KEYS[3]) or 0}
end
return {1, 0}
