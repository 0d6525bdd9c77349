-- ledger_to_sync: switch a cached ASYNC account to SYNC only when nothing charged in Redis is still
-- waiting for the DB; otherwise the DB path would start from a balance that misses those charges. Its holds are then
-- all in the DB (every change of theirs was an entry): the DB's are the ones from now on, Redis drops its copies.
-- KEYS[1] user:balance:{uid}            hash
-- KEYS[2] user:order:consistency:{uid}  zset
-- KEYS[3] user:holds:{uid}              hash of the account's holds: dropped on the switch
-- KEYS[4] user:holds:expiry:{uid}       zset of ACTIVE hold ids: dropped on the switch
-- Returns {'pending', count} or {'ok'} (also when the account is not cached).
local pending = redis.call('ZCARD', KEYS[2])
if pending > 0 then return {'pending', pending} end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'mode', 'SYNC')
  redis.call('HDEL', KEYS[1], 'on_hold')
end
redis.call('DEL', KEYS[3], KEYS[4])
return {'ok'}
