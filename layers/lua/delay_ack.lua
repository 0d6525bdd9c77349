-- delay_ack: acknowledge deliveries (handled for good) by receipt: only the element's current delivery counts, so
-- the late ack of an earlier delivery (whose lease ran out and was handed to another consumer) changes nothing.
-- KEYS[1] dq:taken:{<queue>}  zset  KEYS[2] dq:receipt:{<queue>}  hash  KEYS[3] dq:deliveries:{<queue>}  hash
-- ARGV pairs: sequence, element (a receipt).
-- Returns one 1 (acknowledged) or 0 (stale receipt, or not taken) per pair.
local out = {}
for i = 1, #ARGV, 2 do
  local seq, element = ARGV[i], ARGV[i + 1]
  local current = redis.call('HGET', KEYS[2], element)
  if redis.call('ZSCORE', KEYS[1], element) and current == seq then
    redis.call('ZREM', KEYS[1], element)
    redis.call('HDEL', KEYS[2], element)
    redis.call('HDEL', KEYS[3], element)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
