-- lock_acquire: take or re-enter a Redisson-style lock (hash: owner -> hold count) with a lease, and
-- hand out a fencing token that rises with every new owner. A caller that will wait is queued, so a
-- release wakes one waiter instead of all of them.
-- KEYS[1] lock:{<name>}          hash: <owner> -> hold count, '#fence' -> this holder's token
-- KEYS[2] lock:fence:{<name>}    the last token handed out (never expires). Each new owner gets the larger of
--                                the counter + 1 and Redis' clock at 1000 per millisecond, so tokens only rise
--                                also when Redis lost the counter or some of its last increments (FLUSHALL, a
--                                restart without persistence, a failover to a replica that missed them): every
--                                token handed out before was smaller unless the lock changed owners more than a
--                                million times a second (a hybrid logical clock, as TigerBeetle's cluster
--                                timestamps: wall-clock high part, counter low part, only rising). The DB refuses an
--                                equal token from another holder (t_account.fence_owner) should clocks disagree.
-- KEYS[3] lock:waiters:{<name>}  zset: waiting owner -> until when it counts as waiting (epoch ms)
-- ARGV[1] owner id (process and thread; never starts with '#')  ARGV[2] lease in ms
-- ARGV[3] until when the caller stays queued (epoch ms), 0 when it will not wait. A live waiter re-queues itself on
--         every try and tries at least every half of its liveness window, so a waiter that died drops out of line
--         within that window instead of holding the head of the queue until its give-up time
-- Returns {'acquired', fence token, hold count} (new owner or re-entry; the lease starts again), or
-- {'held', pttl}: another owner holds it for pttl more ms.
if redis.call('EXISTS', KEYS[1]) == 0 then
  local now = redis.call('TIME')
  local fence = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1,
                         tonumber(now[1]) * 1000000 + math.floor(tonumber(now[2]) / 1000) * 1000)
  redis.call('SET', KEYS[2], string.format('%d', fence))
  redis.call('HSET', KEYS[1], ARGV[1], 1, '#fence', fence)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[1])
  return {'acquired', fence, 1}
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  local count = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'acquired', tonumber(redis.call('HGET', KEYS[1], '#fence')), count}
end
if tonumber(ARGV[3]) > 0 then
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
  redis.call('PEXPIRE', KEYS[3], 3600000)  -- a forgotten queue goes; live entries are re-added on every try
end
return {'held', redis.call('PTTL', KEYS[1])}
