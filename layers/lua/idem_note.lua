-- idem_note: the attempt holding an Idempotency-Key's record keeps its recovery point (Stripe's recovery points: what
-- it reserved before any effect, such as the id of the red packet it is sending), so an attempt that takes the record
-- over after it died resumes that work instead of doing it a second time (idem_begin answers 'retaken' with it).
-- KEYS[1] idem:{<scope>}:<key>  hash (idem_begin)
-- ARGV[1] token of the attempt  ARGV[2] the note
-- Returns {'noted'}, or {'not_owner'} when the record is another attempt's or answered.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'state') ~= 'running' then
  return {'not_owner'}
end
redis.call('HSET', KEYS[1], 'note', ARGV[2])
return {'noted'}
