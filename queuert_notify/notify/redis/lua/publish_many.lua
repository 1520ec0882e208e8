-- publish_many: publish every message of a batch in one round trip and one reply
-- (a pipeline of PUBLISH commands costs the client one command to encode and one
-- reply to parse per message).
--
-- ARGV[2i - 1]  the i-th message's channel
-- ARGV[2i]      the i-th message's payload
--
-- Returns the number of messages published. Each PUBLISH stands alone, as it
-- would in a pipeline: receivers see the messages in ARGV's order.
for i = 1, #ARGV, 2 do
  redis.call('PUBLISH', ARGV[i], ARGV[i + 1])
end
return #ARGV / 2
