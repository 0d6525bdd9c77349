-- idem_abandon: an attempt that changed nothing (a transient 503) gives its Idempotency-Key back, unanswered, so a
-- retry with the same key runs again (with any body: nothing was recorded); the key no longer counts in its scope's
-- quota.
-- KEYS[1] idem:{<scope>}:<key>  hash (idem_begin)
-- KEYS[2] idem:quota:{<scope>}  string (idem_begin)
-- ARGV[1] token of the attempt
-- Returns {'released'}, or {'not_owner'} when the record is another attempt's or answered.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'state') ~= 'running' then
  return {'not_owner'}
end
redis.call('DEL', KEYS[1])
if tonumber(redis.call('GET', KEYS[2]) or '0') > 0 then redis.call('DECR', KEYS[2]) end
return {'released'}
