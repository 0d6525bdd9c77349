-- lock_release: leave a Redisson-style lock once; the last release deletes it and wakes the first waiter
-- still alive (one message naming it; the others keep sleeping: no herd of retries). Waiters whose place in line
-- lapsed (dead, or gave up) are dropped first, so the message never goes to a dead waiter.
-- KEYS[1] lock:{<name>}           hash: <owner> -> hold count, '#fence'
-- KEYS[2] lock:released:{<name>}  pub/sub channel the waiters listen on
-- KEYS[3] lock:waiters:{<name>}   zset: waiting owner -> until when it counts as waiting (epoch ms)
-- ARGV[1] owner id  ARGV[2] now (epoch ms)
-- Returns {'not_owner'} (refused: the caller does not hold it, or its lease ran out), {'held', count left}
-- or {'released'}.
local function wake_next()
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[2])
  local next_owner = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if next_owner then redis.call('SPUBLISH', KEYS[2], next_owner) end
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  if redis.call('EXISTS', KEYS[1]) == 0 then wake_next() end
  return {'not_owner'}
end
local count = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if count > 0 then return {'held', count} end
redis.call('DEL', KEYS[1])
wake_next()
return {'released'}
