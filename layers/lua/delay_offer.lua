-- delay_offer: put an element into a delay queue, due at a time. The element itself is the zset member, so
-- offering it again keeps one entry and moves its due time, and removing it is one ZREM (O(log n)): no
-- side list to scan (Redisson's delayed queue kept one and removed in O(n)).
-- KEYS[1] dq:due:{<queue>}       zset: element -> due (epoch ms)
-- KEYS[2] dq:earliest:{<queue>}  pub/sub channel: the new earliest due, for pollers sleeping until then
-- KEYS[3] dq:taken:{<queue>}  zset (counted against ARGV[3])  KEYS[4] dq:deliveries:{<queue>}  hash
-- KEYS[5] dq:dead:{<queue>}  zset
-- An element offered again while not taken starts afresh: its delivery count is reset and, if it was a dead
-- letter, it leaves the dead letters (offered again = replayed). While taken, its current delivery keeps its count.
-- ARGV[1] element (canonical encoding)  ARGV[2] due (epoch ms)
-- ARGV[3] most elements the queue may hold, waiting + taken ('0': no bound); a new element past it is refused
-- Returns {1 if new else 0 (due moved), earliest due in the queue}, or {'full', elements held} (nothing changed).
local bound = tonumber(ARGV[3] or '0') or 0
if bound > 0 and not redis.call('ZSCORE', KEYS[1], ARGV[1]) and not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  local held = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[3])
  if held >= bound then return {'full', held} end
end
local added = redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  redis.call('HDEL', KEYS[4], ARGV[1])
  redis.call('ZREM', KEYS[5], ARGV[1])
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if head[1] == ARGV[1] then redis.call('SPUBLISH', KEYS[2], ARGV[2]) end
return {added, head[2]}
