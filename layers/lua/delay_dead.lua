-- delay_dead: replay or drop dead letters. Replay queues the element again, due now, with its delivery count
-- reset; drop forgets it. Either way it leaves the dead letters.
-- KEYS[1] dq:dead:{<queue>}  zset  KEYS[2] dq:deliveries:{<queue>}  hash  KEYS[3] dq:due:{<queue>}  zset
-- KEYS[4] dq:earliest:{<queue>}  pub/sub channel (a replay publishes its due time when it is the earliest)
-- ARGV[1] 'replay' or 'drop'  ARGV[2] now (epoch ms)  ARGV[3...] elements
-- Returns one 1 (replayed or dropped) or 0 (not a dead letter) per element.
local out = {}
for i = 3, #ARGV do
  local element = ARGV[i]
  if redis.call('ZREM', KEYS[1], element) == 1 then
    redis.call('HDEL', KEYS[2], element)
    if ARGV[1] == 'replay' then
      redis.call('ZADD', KEYS[3], ARGV[2], element)
      if redis.call('ZRANGE', KEYS[3], 0, 0)[1] == element then redis.call('SPUBLISH', KEYS[4], ARGV[2]) end
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
