-- ledger_set_open: an operator closes ('ADMIN') or reopens ('1') a cached account, and the change takes a version
-- of its own: every entry charged before it carries a lower version, so its open flag never undoes the operator's
-- (the writer takes an event's flag only when the event is newer than the DB's version, which the caller raises
-- to the version returned here in the same DB transaction).
-- KEYS[1] user:balance:{uid}  hash
-- ARGV[1] the flag ('1' | 'ADMIN')  ARGV[2] the DB version of the account
-- Returns the new version, max(cached v, ARGV[2]) + 1, or 0 when the account is not cached (nothing set).
local v = redis.call('HGET', KEYS[1], 'v')
if not v then return 0 end
local new_v = math.max(tonumber(v), tonumber(ARGV[2])) + 1
redis.call('HSET', KEYS[1], 'v', string.format('%d', new_v), 'open', ARGV[1])
return new_v
