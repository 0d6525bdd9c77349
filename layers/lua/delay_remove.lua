-- delay_remove: take an element out of a delay queue, whether waiting or taken and not yet acknowledged.
-- KEYS[1] dq:due:{<queue>}  zset  KEYS[2] dq:taken:{<queue>}  zset: element -> visibility deadline (ms)
-- ARGV[1] element
-- Returns 1 when it was there, 0 when not.
local removed = redis.call('ZREM', KEYS[1], ARGV[1]) + redis.call('ZREM', KEYS[2], ARGV[1])
return math.min(removed, 1)
