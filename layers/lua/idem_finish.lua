-- idem_finish: keep the answer of the attempt that holds an Idempotency-Key's record (see idem_begin).
-- KEYS[1] idem:{<scope>}:<key>  hash (idem_begin)
-- ARGV[1] token of the attempt  ARGV[2] HTTP status  ARGV[3] body (JSON text)  ARGV[4] the record's lifetime (s)
-- Returns {'done'}, or {'not_owner'} when another attempt took the record over (its lease ran out) or it expired.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return {'not_owner'} end
redis.call('HSET', KEYS[1], 'state', 'done', 'status', ARGV[2], 'body', ARGV[3])
redis.call('HDEL', KEYS[1], 'lease_until')
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
return {'done'}
