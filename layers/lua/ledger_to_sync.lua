-- ledger_to_sync: switch a cached ASYNC account to SYNC only when nothing charged in Redis is still
-- waiting for the DB (the DB path would start from a balance that misses those charges) and no hold is ACTIVE
-- (holds live on the ASYNC path: their captures, voids and expiries run in Redis).
-- KEYS[1] user:balance:{uid}            hash (on_hold: what ACTIVE holds keep)
-- KEYS[2] user:order:consistency:{uid}  zset
-- Returns {'pending', count}, {'holds', on_hold} or {'ok'} (also when the account is not cached).
local pending = redis.call('ZCARD', KEYS[2])
if pending > 0 then return {'pending', pending} end
local on_hold = tonumber(redis.call('HGET', KEYS[1], 'on_hold') or '0')
if on_hold > 0 then return {'holds', string.format('%d', on_hold)} end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'mode', 'SYNC') end
return {'ok'}
