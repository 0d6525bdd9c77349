-- ledger_rollback: give back in Redis a ledger_apply whose event could not be published. Run only once the DB
-- recorded the entry as rolled back (t_rolled_back, under the account row lock: LedgerStore.record_rollback), by
-- the API before it answers PUBLISH_FAILED, or by the writer/reconciler that meets such an entry still pending.
-- The DB is the arbiter, so a 'claimed' fate does not stop it (that writer will skip the entry).
-- KEYS[1] user:balance:{uid}            hash
-- KEYS[2] user:order:{uid}:<id>         entry string (amount;ts;balanceAfter;version;kind;epoch;open;idemKey)
-- KEYS[3] user:order:consistency:{uid}  zset
-- KEYS[4] user:order:fate:{uid}:<id>    'claimed' (writer) | 'rolledback' (this script)
-- KEYS[5] user:idem:{uid}:<key>         idempotency record, deleted when it points at this entry
-- KEYS[6] user:idem:quota:{uid}         string (ledger_apply): a counted record deleted here gives its count back
-- KEYS[7] user:held:{uid}               hash: a held credit taken back here leaves the held total too; a capture's
--                                       'h<hold id>' ends its inflight count, an authorize's 'a<hold id>' its
--                                       ':authorizing' mark
-- KEYS[8] user:holds:{uid}              hash: a hold's change taken back here is undone in its record
-- KEYS[9] user:holds:expiry:{uid}       zset: a hold made ACTIVE again goes back in, by its expires_at
-- KEYS[10] user:refunds:{uid}           hash: charge id -> refunded total; a refund taken back lowers it
-- KEYS[11] user:grants:{uid}            hash (lib/grants): a granted recharge taken back takes its grant, a deduct
--                                       or a capture gives each grant it spent its part back, a refund takes what
--                                       it gave back, a grant expiry puts its grant back
-- KEYS[12] user:grants:expiry:{uid}     zset (lib/grants)
-- ARGV[1] entry id  ARGV[2] fate TTL in seconds  ARGV[3] '1' when the key is counted (a client key), else ''
-- Returns:
--   {'gone'}                  nothing left to undo (already given back, or Redis lost it); tombstone set
--   {'rolled_back', balance, v}  money given back; the tombstone lets the writer skip it without asking the DB
--   {'rolled_back'}           entry removed but the account hash was lost; the DB never charged it
--! include entry
--! include kinds
--! include holds
--! include grants
redis.call('SET', KEYS[4], 'rolledback', 'EX', ARGV[2])
local entry = redis.call('GET', KEYS[2])
if (not entry) or (not redis.call('ZSCORE', KEYS[3], ARGV[1])) then return {'gone'} end
local e = entry_fields(entry)
local amount, kind = tonumber(e.amount), e.kind
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('HGET', KEYS[5], 'id') == ARGV[1] then
  redis.call('DEL', KEYS[5])
  if ARGV[3] == '1' and tonumber(redis.call('GET', KEYS[6]) or '0') > 0 then redis.call('DECR', KEYS[6]) end
end
local held = redis.call('HGET', KEYS[7], ARGV[1])
redis.call('HDEL', KEYS[7], ARGV[1])
if held and string.sub(held, 1, 1) == 'h' then
  local field = string.sub(held, 2) .. ':inflight'
  if redis.call('HINCRBY', KEYS[8], field, -1) <= 0 then redis.call('HDEL', KEYS[8], field) end
  held = nil
elseif held and string.sub(held, 1, 1) == 'a' then
  redis.call('HDEL', KEYS[8], string.sub(held, 2) .. ':authorizing')
  held = nil
end
local h = redis.call('HMGET', KEYS[1], 'balance', 'open')
if not h[1] then return {'rolled_back'} end
if held and redis.call('HINCRBY', KEYS[1], 'held', -tonumber(held)) <= 0 then redis.call('HDEL', KEYS[1], 'held') end
local open, balance = h[2]
if kind_in(KIND_CHANGES_HOLD, kind) then
  -- a hold's change: its record back to before it. A terminal change waited for every capture before it to be
  -- durable (hold_change's 'busy'), so nothing after it can depend on it; H is taken back before its id was answered
  local hold_id, released = e.hold_id, tonumber(e.released)
  local rec = redis.call('HGET', KEYS[8], hold_id)
  local back = 0  -- what returns to on_hold
  if kind == 'H' then
    redis.call('HDEL', KEYS[8], hold_id)
    redis.call('ZREM', KEYS[9], hold_id)
    back = -amount
  elseif rec then
    local r = hold_fields(rec)
    local terminal = e.hold_state ~= 'ACTIVE'
    if kind == 'C' then r[2] = string.format('%d', tonumber(r[2]) - amount) end
    if terminal then
      r[3] = 'ACTIVE'
      redis.call('ZADD', KEYS[9], r[4], hold_id)
      back = kind == 'C' and (amount + released) or amount  -- V, X: amount is what they released
    elseif r[3] == 'ACTIVE' then
      back = amount
    end
    redis.call('HSET', KEYS[8], hold_id, hold_string(r))
  end
  if kind == 'C' then balance = redis.call('HINCRBY', KEYS[1], 'balance', amount) else balance = tonumber(h[1]) end
  if (e.grants_spent or '') ~= '' then grants_give_back(KEYS[11], e.grants_spent) end  -- a capture's spends
  if back ~= 0 and redis.call('HINCRBY', KEYS[1], 'on_hold', back) <= 0 then redis.call('HDEL', KEYS[1], 'on_hold') end
  if balance > 0 and open == 'BALANCE' then open = '1' end
elseif kind_in(KIND_DEBITS, kind) then  -- a debit: given back (an ended grant back, spent grants given back)
  balance = redis.call('HINCRBY', KEYS[1], 'balance', amount)
  if balance > 0 and open == 'BALANCE' then open = '1' end
  if kind_in(KIND_ENDS_GRANT, kind) then
    grant_add(KEYS[1], KEYS[11], KEYS[12], e.grant_id, amount, e.ended_expires_at, e.ended_category)
  elseif (e.grants_spent or '') ~= '' then
    grants_give_back(KEYS[11], e.grants_spent)
  end
else  -- a credit: taken back (a refund's charge's refunded total goes back down too, a granted credit's grant goes)
  balance = redis.call('HINCRBY', KEYS[1], 'balance', -amount)
  if balance <= 0 and open == '1' then open = 'BALANCE' end
  if kind_in(KIND_REFUNDS, kind) and redis.call('HEXISTS', KEYS[10], e.refund_of) == 1 then redis.call('HINCRBY', KEYS[10], e.refund_of, -amount) end
  if (e.grants_refunded or '') ~= '' then grants_give_back(KEYS[11], e.grants_refunded, -1) end  -- a refund's give-back
  if (e.grant_expires_at or '') ~= '' then grant_remove(KEYS[11], KEYS[12], ARGV[1]) end
end
local v = redis.call('HINCRBY', KEYS[1], 'v', 1)
redis.call('HSET', KEYS[1], 'open', open)
return {'rolled_back', string.format('%d', balance), string.format('%d', v)}
