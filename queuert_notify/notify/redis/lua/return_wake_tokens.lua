-- return_wake_tokens: give tokens a consumer moved but will not use back to the
-- head of their token list, where the next waiting consumer takes them.
--
-- KEYS[1]  this consumer's processing list of a type
-- KEYS[2]  the type's token list
-- KEYS[3]  the type's consumers (sorted set of heartbeats)
-- ARGV[1]  how many tokens to return; 0: all of them, and leave KEYS[3] (the
--          consumer stops listening to this type)
-- ARGV[2]  this consumer's id
-- ARGV[3]  time to live of the token list in seconds
--
-- Returns the number of tokens returned.
local wanted = tonumber(ARGV[1])
local returned = 0
while (wanted == 0 or returned < wanted)
    and redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT') do
  returned = returned + 1
end
if returned > 0 then
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
if wanted == 0 then
  redis.call('ZREM', KEYS[3], ARGV[2])
end
return returned
