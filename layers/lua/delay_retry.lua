-- delay_retry: a delivery failed (its handler raised). The element stays taken and comes back after an exponential
-- backoff, base * 2^(deliveries - 1) capped; once it was delivered max_deliveries times it moves to the dead
-- letters instead (SQS's maxReceiveCount). By receipt: a stale one changes nothing.
-- KEYS[1] dq:taken:{<queue>}  zset  KEYS[2] dq:receipt:{<queue>}  hash  KEYS[3] dq:deliveries:{<queue>}  hash
-- KEYS[4] dq:dead:{<queue>}   zset: dead letter -> when it died (epoch ms)
-- ARGV[1] now (epoch ms)  ARGV[2] backoff base (ms)  ARGV[3] backoff cap (ms)  ARGV[4] max deliveries (0: no limit)
-- then pairs: sequence, element
-- Returns one 0 (stale receipt, or not taken), 1 (will be retried) or 2 (dead-lettered) per pair.
local now, base, cap, max = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
for i = 5, #ARGV, 2 do
  local seq, element = ARGV[i], ARGV[i + 1]
  if redis.call('ZSCORE', KEYS[1], element) and redis.call('HGET', KEYS[2], element) == seq then
    local count = tonumber(redis.call('HGET', KEYS[3], element) or '1')
    if max > 0 and count >= max then
      redis.call('ZREM', KEYS[1], element)
      redis.call('HDEL', KEYS[2], element)
      redis.call('ZADD', KEYS[4], now, element)
      out[#out + 1] = 2
    else
      redis.call('ZADD', KEYS[1], 'XX', now + math.min(cap, base * 2 ^ math.min(count - 1, 40)), element)
      out[#out + 1] = 1
    end
  else
    out[#out + 1] = 0
  end
end
return out
