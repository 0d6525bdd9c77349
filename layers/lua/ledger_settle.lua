-- ledger_settle: after the DB commit, drop persisted entries from the consistency set and flag the account
-- when an entry was charged from an earlier cache load (Redis lost writes): the reconciler corrects it.
-- KEYS[1] user:order:consistency:{uid}  zset
-- KEYS[2] user:balance:{uid}            hash (held: the credits not durable yet)
-- KEYS[3] user:held:{uid}               hash: entry id -> amount of a held credit; a persisted credit's hold is
--                                       released here (its request may have died before ledger_post)
-- KEYS[4..n] user:order:{uid}:<id>      entry strings of the persisted entries: each becomes
--                                       'settled;<entry string>' for SETTLED_TTL_S (resend evidence, below); the
--                                       entry ids (the consistency set's members) are the keys' last part
-- ARGV[1] comma-separated epochs of the persisted entries
-- Returns {removed from the zset, 1 if the account was flagged dirty else 0}.
-- Resend evidence: redis-py resends a ledger_apply whose reply was lost, up to RETRY_HORIZON_S (dal/redis_store.py,
-- ~18 s) after the first attempt, while the writer may persist and settle the charge within milliseconds. The
-- entry string is kept, marked settled (no reader counts it as pending), so ledger_apply answers the resend
-- instead of charging twice (TigerBeetle keeps each client's last reply to answer its resends). The TTL is
-- many times the horizon; only a Redis stalled longer than that with the resend in its input buffer escapes it.
local SETTLED_TTL_S = 300
local removed = 0
if #KEYS > 3 then
  local ids = {}
  for i = 4, #KEYS do ids[#ids + 1] = string.match(KEYS[i], ':(%d+)$') end
  removed = redis.call('ZREM', KEYS[1], unpack(ids))
  local released = 0
  for _, id in ipairs(ids) do
    local amount = redis.call('HGET', KEYS[3], id)
    if amount then
      redis.call('HDEL', KEYS[3], id)
      released = released + tonumber(amount)
    end
  end
  if released > 0 and redis.call('HINCRBY', KEYS[2], 'held', -released) <= 0 then redis.call('HDEL', KEYS[2], 'held') end
end
for i = 4, #KEYS do
  local entry = redis.call('GET', KEYS[i])
  if entry and string.sub(entry, 1, 8) ~= 'settled;' then
    redis.call('SET', KEYS[i], 'settled;' .. entry, 'EX', SETTLED_TTL_S)
  end
end
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
