-- delay_remove: take an element out of a delay queue, whether waiting or taken and not yet acknowledged (its
-- receipt and delivery count go too; a dead letter stays: those are replayed or dropped on their own).
-- KEYS[1] dq:due:{<queue>}  zset  KEYS[2] dq:taken:{<queue>}  zset: element -> visibility deadline (ms)
-- KEYS[3] dq:receipt:{<queue>}  hash  KEYS[4] dq:deliveries:{<queue>}  hash  KEYS[5] dq:dead:{<queue>}  zset
-- ARGV[1] element
-- Returns 1 when it was there, 0 when not.
local removed = redis.call('ZREM', KEYS[1], ARGV[1]) + redis.call('ZREM', KEYS[2], ARGV[1])
if removed > 0 then
  redis.call('HDEL', KEYS[3], ARGV[1])
  if redis.call('ZSCORE', KEYS[5], ARGV[1]) == false then redis.call('HDEL', KEYS[4], ARGV[1]) end
end
return math.min(removed, 1)
