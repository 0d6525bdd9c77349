-- ledger_to_sync: switch a cached ASYNC account to SYNC only when nothing charged in Redis is still
-- waiting for the DB; otherwise the DB path would start from a balance that misses those charges.
-- KEYS[1] user:balance:{uid}            hash
-- KEYS[2] user:order:consistency:{uid}  zset
-- Returns {'pending', count} or {'ok'} (also when the account is not cached).
local pending = redis.call('ZCARD', KEYS[2])
if pending > 0 then return {'pending', pending} end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'mode', 'SYNC') end
return {'ok'}
