-- ledger_settle: after the DB commit, drop persisted entries from the pending set and flag the account
-- when an entry was charged from an earlier cache load (Redis lost writes): the reconciler corrects it.
-- KEYS[1] user:order:consistency:{uid}  zset
-- KEYS[2] user:balance:{uid}            hash (held: the credits not durable yet)
-- KEYS[3] user:held:{uid}               hash: entry id -> amount of a held credit; a persisted credit's hold is
--                                       released here (its request may have died before ledger_post); or
--                                       'h<hold id>' of a capture: the hold's inflight count ends here; 'a<hold id>'
--                                       of an authorize: its ':authorizing' mark ends here
-- KEYS[4] user:holds:{uid}              hash: the account's holds; a hold's record leaves once the entry that ended
--                                       it (state CAPTURED, VOIDED or EXPIRED) is in the DB (read there from then on)
-- KEYS[5..n] user:order:{uid}:<id>      entry strings of the persisted entries: each becomes
--                                       'settled;<entry string>' for SETTLED_TTL_S (resend evidence, below); the
--                                       entry ids (the pending set's members) are the keys' last part
-- ARGV[1] comma-separated epochs of the persisted entries
-- Returns {removed from the zset, 1 if the account was flagged dirty else 0}.
-- Resend evidence: redis-py resends a ledger_apply whose reply was lost, up to RETRY_HORIZON_S (dal/redis_store.py,
-- ~18 s) after the first attempt, while the writer may persist and settle the charge within milliseconds. The
-- entry string is kept, marked settled (no reader counts it as pending), so ledger_apply answers the resend
-- instead of charging twice (TigerBeetle keeps each client's last reply to answer its resends). The TTL is
-- many times the horizon; only a Redis stalled longer than that with the resend in its input buffer escapes it.
--! include entry
local SETTLED_TTL_S = 300
local removed = 0
if #KEYS > 4 then
  local ids = {}
  for i = 5, #KEYS do ids[#ids + 1] = string.match(KEYS[i], ':(%d+)$') end
  removed = redis.call('ZREM', KEYS[1], unpack(ids))
  local released = 0
  for _, id in ipairs(ids) do
    local waiting = redis.call('HGET', KEYS[3], id)
    if waiting then
      redis.call('HDEL', KEYS[3], id)
      if string.sub(waiting, 1, 1) == 'h' then
        local field = string.sub(waiting, 2) .. ':inflight'
        if redis.call('HINCRBY', KEYS[4], field, -1) <= 0 then redis.call('HDEL', KEYS[4], field) end
      elseif string.sub(waiting, 1, 1) == 'a' then  -- an authorize: its hold may change now
        redis.call('HDEL', KEYS[4], string.sub(waiting, 2) .. ':authorizing')
      else
        released = released + tonumber(waiting)
      end
    end
  end
  if released > 0 and redis.call('HINCRBY', KEYS[2], 'held', -released) <= 0 then redis.call('HDEL', KEYS[2], 'held') end
end
for i = 5, #KEYS do
  local entry = redis.call('GET', KEYS[i])
  if entry and string.sub(entry, 1, 8) ~= 'settled;' then
    redis.call('SET', KEYS[i], 'settled;' .. entry, 'EX', SETTLED_TTL_S)
    -- a hold's last entry in the DB ends its record here
    local e = entry_fields(entry)
    if e.hold_id and (e.hold_state == 'CAPTURED' or e.hold_state == 'VOIDED' or e.hold_state == 'EXPIRED') then
      redis.call('HDEL', KEYS[4], e.hold_id, e.hold_id .. ':inflight')
    end
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
