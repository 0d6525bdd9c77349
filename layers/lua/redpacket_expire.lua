-- redpacket_expire: close an expired packet to grabs and report whether claims are still in flight.
-- KEYS[1] rp:packet:{rp<id>}  KEYS[2] rp:pending:{rp<id>}
-- ARGV[1] now (epoch ms)
-- Returns {'missing'} when Redis does not hold the packet, {'open'} when it has not expired yet,
-- {'not_open', state} for CREATING / FAILED, or {'expired', claims pending, hold_until, hold_log or ''}: refund
-- once no claim is pending and the hold after a rebuild has passed (time, and the log: outbox/log_hold.py).
local p = redis.call('HMGET', KEYS[1], 'state', 'expires_at', 'hold_until', 'hold_log')
if not p[1] then return {'missing'} end
if p[1] == 'CREATING' or p[1] == 'FAILED' then return {'not_open', p[1]} end
if p[1] == 'OPEN' then
  if tonumber(ARGV[1]) < tonumber(p[2]) then return {'open'} end
  redis.call('HSET', KEYS[1], 'state', 'EXPIRED')
end
return {'expired', redis.call('HLEN', KEYS[2]), p[3], p[4] or ''}
