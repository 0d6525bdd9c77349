-- ledger_cache_update: set fields on a cached account only if it is cached (never create a partial hash): an
-- operator's threshold, set after the DB committed it.
-- KEYS[1] user:balance:{uid}  hash
-- ARGV[1..] field, value, field, value, ...
-- Returns 1 when updated, 0 when not cached.
if not redis.call('HGET', KEYS[1], 'v') then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
