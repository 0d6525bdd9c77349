-- ledger_settle: after the DB commit, drop persisted entries from the consistency set and flag the account
-- when an entry was charged from an earlier cache load (Redis lost writes): the reconciler corrects it.
-- KEYS[1] user:order:consistency:{uid}  zset
-- KEYS[2] user:balance:{uid}            hash
-- KEYS[3..n] user:order:{uid}:<id>      entry strings of the persisted entries
-- ARGV[1] comma-separated epochs of the persisted entries
-- ARGV[2..] persisted entry ids
-- Returns {removed from the zset, 1 if the account was flagged dirty else 0}.
local removed = 0
if #ARGV > 1 then removed = redis.call('ZREM', KEYS[1], unpack(ARGV, 2)) end
if #KEYS > 2 then redis.call('DEL', unpack(KEYS, 3)) end
local epoch = redis.call('HGET', KEYS[2], 'epoch')
if epoch then
  for e in string.gmatch(ARGV[1], '[^,]+') do
    if e ~= epoch then
      redis.call('HSET', KEYS[2], 'dirty', '1')
      return {removed, 1}
    end
  end
end
return {removed, 0}
