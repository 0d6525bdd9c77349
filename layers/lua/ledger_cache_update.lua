-- ledger_cache_update: set fields on a cached account only if it is cached (never create a partial hash),
-- and, when a version is given, only if the cache is older (a SYNC commit bringing Redis up to date).
-- KEYS[1] user:balance:{uid}  hash
-- ARGV[1] DB version, or '' to update unconditionally
-- ARGV[2..] field, value, field, value, ...
-- Returns 1 when updated, 0 when not cached or the cache is not older.
local v = redis.call('HGET', KEYS[1], 'v')
if not v then return 0 end
if ARGV[1] ~= '' and tonumber(v) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
