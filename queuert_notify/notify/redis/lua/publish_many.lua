-- publish_many: publish a batch of messages in one round trip and one reply (a
-- pipeline of PUBLISH commands costs the client one command to encode and one
-- reply to parse per message).
--
-- ARGV[2i - 1]  a channel
-- ARGV[2i]      the payloads of consecutive messages on that channel, joined by
--               NUL (no payload holds NUL: queuert_notify/notify/payloads.py), so
--               the client encodes one argument per run of a channel, not per message
--
-- Returns the number of messages published. Each PUBLISH stands alone, as in a
-- pipeline: receivers see the messages in ARGV's order.
local published = 0
for i = 1, #ARGV, 2 do
  local channel, joined = ARGV[i], ARGV[i + 1]
  local start = 1
  while true do
    local stop = string.find(joined, '\0', start, true)
    redis.call('PUBLISH', channel, string.sub(joined, start, (stop or 0) - 1))
    published = published + 1
    if stop == nil then
      break
    end
    start = stop + 1
  end
end
return published
