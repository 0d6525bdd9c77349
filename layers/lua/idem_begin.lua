-- idem_begin: open (or answer) the idempotency record of one client Idempotency-Key in its scope (Stripe's model:
-- a key is bound to the first request's fingerprint; its first answer is replayed; a request in flight holds it).
-- KEYS[1] idem:{<scope>}:<key>  hash: fp, state ('running' | 'done'), token, lease_until (epoch ms), status, body,
--                               note (the holder's recovery point, idem_note)
-- KEYS[2] idem:quota:{<scope>}  string: keys the scope opened in the current window (expires with the window)
-- ARGV[1] fingerprint of the request  ARGV[2] token of this attempt  ARGV[3] now (epoch ms)  ARGV[4] lease (ms)
-- ARGV[5] the record's lifetime (s), also the quota window  ARGV[6] most keys a scope opens per window
-- Returns {'new'}: the record is this attempt's (a new key); {'retaken', note}: the attempt holding it died and its
-- lease ran out: the record is this attempt's, which resumes from the dead one's note ('' when it left none);
-- {'replay', status, body}: the key's answer; {'conflict'}: the key was used with another request;
-- {'running'}: the first attempt with this key is still in flight; {'too_many'}: a new key past the scope's quota
-- (nothing was written).
local fp = redis.call('HGET', KEYS[1], 'fp')
local now = tonumber(ARGV[3])
if not fp then
  if tonumber(redis.call('GET', KEYS[2]) or '0') >= tonumber(ARGV[6]) then return {'too_many'} end
  if redis.call('INCR', KEYS[2]) == 1 then redis.call('EXPIRE', KEYS[2], tonumber(ARGV[5])) end
  redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'state', 'running', 'token', ARGV[2], 'lease_until', now + tonumber(ARGV[4]))
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
  return {'new'}
end
if fp ~= ARGV[1] then return {'conflict'} end
if redis.call('HGET', KEYS[1], 'state') == 'done' then
  local answer = redis.call('HMGET', KEYS[1], 'status', 'body')
  return {'replay', answer[1], answer[2]}
end
if tonumber(redis.call('HGET', KEYS[1], 'lease_until')) > now then return {'running'} end
redis.call('HSET', KEYS[1], 'token', ARGV[2], 'lease_until', now + tonumber(ARGV[4]))
return {'retaken', redis.call('HGET', KEYS[1], 'note') or ''}
