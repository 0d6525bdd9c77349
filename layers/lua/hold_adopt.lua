-- hold_adopt: put back into the cached account a hold the DB has ACTIVE and Redis does not know: Redis lost it (its
-- authorize was on its way to the DB when the account was loaded again). Only for a hold past its expires_at and a
-- grace (the reconciler's), so that every change of it made before the loss is in the DB by then; its expiry follows.
-- KEYS[1] user:balance:{uid}       hash (on_hold: what the ACTIVE holds keep)
-- KEYS[2] user:holds:{uid}         hash: hold id -> 'amount;captured;state;expiresAt;createdAt;description'
-- KEYS[3] user:holds:expiry:{uid}  zset: ACTIVE hold ids by expires_at
-- ARGV[1] hold id  ARGV[2] its record as the DB has it  ARGV[3] expires_at  ARGV[4] what it keeps (amount - captured)
-- Returns {'missing'} when the account is not cached, {'known'} when Redis has the hold (nothing changed), or
-- {'adopted'}.
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return {'known'} end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
redis.call('HINCRBY', KEYS[1], 'on_hold', ARGV[4])
return {'adopted'}
