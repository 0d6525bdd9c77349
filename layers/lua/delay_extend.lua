-- delay_extend: push a delivery's visibility deadline out (SQS ChangeMessageVisibility), by receipt: only the
-- element's current delivery can; an earlier one's receipt changes nothing.
-- KEYS[1] dq:taken:{<queue>}  zset: element -> deadline  KEYS[2] dq:receipt:{<queue>}  hash
-- ARGV[1] new deadline (epoch ms), then pairs: sequence, element
-- Returns one 1 (extended) or 0 (stale receipt, or not taken) per pair.
local out = {}
for i = 2, #ARGV, 2 do
  local seq, element = ARGV[i], ARGV[i + 1]
  if redis.call('ZSCORE', KEYS[1], element) and redis.call('HGET', KEYS[2], element) == seq then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[1], element)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
