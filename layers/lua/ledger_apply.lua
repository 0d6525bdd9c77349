-- ledger_apply: charge or credit an ASYNC account held in Redis by a kind of ledger/kinds.py made here (applied: a
-- deduct D, a recharge R, ...; what it does is read from KINDS, lib/kinds), record the entry for the writer and the
-- reconciler, and remember the answer for an Idempotency-Key.
-- All keys share the {uid} hash tag (one Redis Cluster slot).
-- KEYS[1] user:balance:{uid}           hash: balance, v, threshold, open, mode, epoch, ts, held (the credits in
--                                      balance that are not durable yet: shown, not spendable), on_hold, and after
--                                      a rebuild hold_until and hold_log (ledger_load)
-- KEYS[2] user:order:{uid}:<id>        string set here (lib/entry): amount;ts;balanceAfter;version;kind;epoch;open;idemKey
-- KEYS[3] user:order:consistency:{uid} zset: entry ids not yet in the DB, scored by ts
-- KEYS[4] user:idem:{uid}:<key>        hash: fp, id, balance, v, state ('pending' | 'done' | 'refused'), refused
--                                      (the refusal's reply status), ts (touched only when ARGV[6] ~= '')
-- KEYS[5] events:{s<n>}                the event stream (written only when ARGV[11] is 'stream')
-- KEYS[6] user:idem:quota:{uid}        string: client Idempotency-Key records the account opened in the current
--                                      window (ARGV[7] seconds from its first; ledger_rollback gives one back)
-- KEYS[7] user:held:{uid}              hash: entry id -> amount of each credit held until its event is durable
--                                      (a credit whose kind waits_for_durable, e.g. R, with the Kafka transport: ledger_post or ledger_settle releases it,
--                                      ledger_rollback takes it back). A deduct spends balance - held only, so it
--                                      never spends a credit that is then rolled back (TigerBeetle's pending transfer)
-- KEYS[8] user:holds:{uid}             hash: hold id -> 'amount;captured;...' (hold_authorize)
-- KEYS[9] user:holds:expiry:{uid}      zset: ACTIVE hold ids by expires_at: a deduct spends balance - held credits -
--                                      the live holds (on_hold less those past expires_at, tidied or not)
-- KEYS[10] user:grants:{uid}           hash: grant id -> 'remaining;expires_at;category' (lib/grants)
-- KEYS[11] user:grants:expiry:{uid}    zset: grant ids by expires_at: a debit that spends grants (D) spends the live
--                                      grants first-to-expire, then the plain balance; a plain-only one (T) spends
--                                      only the plain balance (the live grants are out of its reach); a grant past
--                                      expires_at counts for nothing
-- ARGV[1] kind: a letter of KINDS that is applied (a debit: balance -1, or a credit: +1)
-- ARGV[2] amount in minor units (integer > 0)
-- ARGV[3] ts, epoch milliseconds
-- ARGV[4] entry id (decimal string, never converted to a number)
-- ARGV[5] entry key TTL in seconds
-- ARGV[6] request fingerprint, '' when the request has no Idempotency-Key
-- ARGV[7] idempotency record TTL in seconds
-- ARGV[8] largest balance allowed (keeps every balance exact in a Lua double)
-- ARGV[9] ts before which a 'pending' idempotency record is stale: its request died between the
--         charge and the broker's answer; the charge stands (a rollback would have deleted the
--         record), so the first answer is replayed and the caller publishes the entry again
-- ARGV[10] the Idempotency-Key itself ('' when none; [A-Za-z0-9_.:-] only), kept in the entry and the event
-- ARGV[11] 'stream': XADD the ledger event to KEYS[5] here, atomically with the charge (Redis Streams
--          transport: nothing to publish or roll back afterwards); '' with the Kafka transport
-- ARGV[12] the user id (for the streamed event)
-- ARGV[13] 'checked' when the caller found no answer for the key in the DB (t_idempotency) either; '' to be told
--          {'unknown_key'} when Redis has no record (Redis keeps records for ARGV[7] seconds and may lose them:
--          the DB keeps every answer for good, so a key Redis does not know is looked up there before charging)
-- ARGV[14] '1': a business refusal (closed, insufficient, limit) is the key's answer and recorded in KEYS[4];
--          '': it is not (the service's own keys, whose callers charge again under the key once the cause is gone)
-- ARGV[15] most entries the account may hold in KEYS[3] (charged, not yet in the DB); '' or '0': no bound
-- ARGV[16] most new records KEYS[6] counts per window (MAX_IDEMPOTENCY_KEYS); '' or '0': the key is not counted
--          (no key, or the service's own: one per packet, item or payment order, which the client cannot mint).
--          Only client keys are counted, and a client key's refusal is always its answer (ARGV[14] '1')
-- ARGV[17] kind R: the grant's expires_at (epoch ms) when the credit is a grant (its id is the entry id); '' for none
-- ARGV[18] kind R with a grant: its category
-- The entry string of a granted recharge ends ';<expires_at>;<category>', of a deduct that spent grants
-- ';<grant id>:<spent>,...' (first-to-expire), and the streamed event carries them (lib/entry: grant_expires_at,
-- grant_category, grants_spent).
-- open is '1' (open), 'BALANCE' (closed because balance <= 0) or 'ADMIN' (closed by an operator).
-- Returns one of:
--   {'missing'}                        no cached account: load it from the DB, then retry
--   {'sync'}                           the account is SYNC: charge in the DB instead
--   {'unknown_key'}                    ARGV[13] is not 'checked' and Redis has no record of the Idempotency-Key:
--                                      look the key up in the DB, then call again with ARGV[13] 'checked'
--   {'recovering', until}              ARGV[13] is 'checked' (or, without a key, a debit that spends the account's
--                                      grants) and the account was rebuilt after a Redis loss less than its hold ago
--                                      (hold_until): the key's first charge (a spend of the grants) may still be on
--                                      its way to the DB; nothing changed, not the key's answer
--   {'held', until}                    as 'recovering', past hold_until while hold_log is set: this caller checks the
--                                      writer's watermark (outbox/log_hold.py), the others answer 'recovering' for
--                                      the next second
--   {'closed', balance, v}             a debit on a closed API
--   {'insufficient', balance, v}       a debit with balance - held - live holds - expired grants - amount < threshold
--                                      (a plain-only debit: also less the live grants)
--   {'limit', balance, v}              a credit would pass ARGV[8]
--                                      (a refusal is the key's answer: recorded like a charge, and replayed with
--                                      the balance and v it was refused at; TigerBeetle's id_already_failed)
--   {'too_many_pending'}               KEYS[3] holds ARGV[15] entries: nothing changed, not the key's answer
--   {'too_many_keys'}                  a new counted key past ARGV[16] this window: nothing changed, not the key's
--                                      answer (its existing keys still answer above)
--   {'conflict'}                       Idempotency-Key already used with another body
--   {'in_progress'}                    Idempotency-Key's first request is still publishing (not stale)
--   {'replay', id, balance, v, state}  Idempotency-Key seen with this body: the first answer; state 'done'
--                                      (acknowledged by the broker) or 'pending' (its request died: stale)
--   {'ok', id, balance, v, epoch, open, grant} charged (grant: the entry's grant field, '' for none); also when
--                                      KEYS[2] exists: this very call ran already and is resent after a lost reply,
--                                      so it answers as it did, charging nothing
--! include rebuild_hold
--! include kinds
--! include grants
--! include holds
--! include event
local kind, amount, ts, id = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local fingerprint = ARGV[6]

-- a client resending this call after its reply was lost must not charge twice: the entry answers, also once
-- the writer persisted it (ledger_settle keeps it as 'settled;<entry string>' past any resend)
local applied = redis.call('GET', KEYS[2])
if applied then
  local e = entry_fields(applied)
  return {'ok', id, e.balance_after, e.version, e.epoch, e.open, entry_tail(e)}
end

if fingerprint ~= '' then
  local seen = redis.call('HMGET', KEYS[4], 'fp', 'id', 'balance', 'v', 'state', 'ts')
  if seen[1] then
    if seen[1] ~= fingerprint then return {'conflict'} end
    if seen[5] == 'refused' then return {redis.call('HGET', KEYS[4], 'refused'), seen[3], seen[4]} end
    if seen[5] ~= 'done' and tonumber(seen[6]) >= tonumber(ARGV[9]) then return {'in_progress'} end
    return {'replay', seen[2], seen[3], seen[4], seen[5]}
  end
end

local h = redis.call('HMGET', KEYS[1], 'balance', 'v', 'threshold', 'open', 'mode', 'epoch', 'held', 'on_hold',
  'hold_until', 'hold_log', 'grants')
if not h[1] then return {'missing'} end
if h[5] == 'SYNC' then return {'sync'} end
if fingerprint ~= '' then
  if ARGV[13] ~= 'checked' then return {'unknown_key'} end
  -- a key neither Redis nor the DB knows, on an account rebuilt after a Redis loss: its first charge may have been
  -- acknowledged before the loss and still be on its way to the DB, so it waits for the log to be applied
  local held = rebuild_hold(KEYS[1], h[9], h[10], tonumber(ts))
  if held then return held end
end

-- a refusal changes nothing but the key's record: its answer for as long as the record lives
local function refuse(status)
  if fingerprint ~= '' and ARGV[14] == '1' then
    redis.call('HSET', KEYS[4], 'fp', fingerprint, 'balance', h[1], 'v', h[2], 'state', 'refused', 'refused', status,
      'ts', ts)
    redis.call('EXPIRE', KEYS[4], ARGV[7])
  end
  return {status, h[1], h[2]}
end

-- memory is finite (noeviction): an account whose entries do not reach the DB takes no more until the writer
-- caught up (retryable: not recorded for the key)
local max_pending = tonumber(ARGV[15] or '') or 0
if max_pending > 0 and redis.call('ZCARD', KEYS[3]) >= max_pending then return {'too_many_pending'} end

-- every path below records the new key (a charge, or a refusal that is its answer): count it, one INCR on the hot
-- path; past the quota it is taken back and nothing is recorded (noeviction: one caller must not fill Redis)
local max_keys = tonumber(ARGV[16] or '') or 0
if fingerprint ~= '' and max_keys > 0 then
  local opened = redis.call('INCR', KEYS[6])
  if opened == 1 then redis.call('EXPIRE', KEYS[6], ARGV[7]) end
  if opened > max_keys then
    redis.call('DECR', KEYS[6])
    return {'too_many_keys'}
  end
end

local balance, open = tonumber(h[1]), h[4]
local spent = ''  -- what a debit spent of the account's grants
if kind_in(KIND_DEBITS, kind) then
  if open ~= '1' then return refuse('closed') end
  local on_hold = live_holds(tonumber(h[8]) or 0, KEYS[8], KEYS[9], ts)
  -- only accounts with grants pay for them (lib/grants: the hash's grants field)
  local has_grants = h[11] == '1' or (not h[11] and grants_looked_up(KEYS[1], KEYS[11]))
  if has_grants then
    if fingerprint == '' and kind_in(KIND_SPENDS_GRANTS, kind) then
      -- a spend acknowledged before a Redis loss may still be in the log, and the grants rebuilt from the DB lack it:
      -- a debit that spends them waits for the log as a key Redis does not know does (keyed ones waited above)
      local held = rebuild_hold(KEYS[1], h[9], h[10], tonumber(ts))
      if held then return held end
    end
    -- what expired grants still hold is out of reach as a live hold's money is, until their expiry entry takes it
    on_hold = on_hold + grants_expired(KEYS[10], KEYS[11], ts)
    -- a plain-only debit (a transfer's) reaches no grant either: promo credit stays on its account
    if kind_in(KIND_PLAIN_ONLY, kind) then on_hold = on_hold + grants_live(KEYS[10], KEYS[11], KEYS[7], ts) end
  end
  if balance - (tonumber(h[7]) or 0) - on_hold - amount < tonumber(h[3]) then return refuse('insufficient') end
  if has_grants and kind_in(KIND_SPENDS_GRANTS, kind) then spent = grants_spend(KEYS[10], KEYS[11], KEYS[7], ts, amount) end
  balance = balance - amount
  if balance <= 0 then open = 'BALANCE' end
else
  if balance + amount > tonumber(ARGV[8]) then return refuse('limit') end
  balance = balance + amount
  if balance > 0 and open == 'BALANCE' then open = '1' end
  if (ARGV[17] or '') ~= '' then
    grant_add(KEYS[1], KEYS[10], KEYS[11], id, amount, ARGV[17], ARGV[18])
  end
  if kind_in(KIND_WAITS_FOR_DURABLE, kind) and ARGV[11] ~= 'stream' then  -- streamed, the event is durable in this very step
    redis.call('HSET', KEYS[7], id, ARGV[2])
    redis.call('HINCRBY', KEYS[1], 'held', amount)
  end
end
-- the account's hash written once: the balance and the version are exact in a Lua double (ARGV[8] bounds them)
local balance_s, v_s = string.format('%d', balance), string.format('%d', (tonumber(h[2]) or 0) + 1)
redis.call('HSET', KEYS[1], 'balance', balance_s, 'v', v_s, 'ts', ts, 'open', open)
local entry = {amount = ARGV[2], ts = ts, balance_after = balance_s, version = v_s, kind = kind, epoch = h[6],
  open = open, idem_key = ARGV[10], grants_spent = spent, grant_expires_at = ARGV[17], grant_category = ARGV[18]}
local entry_s, tail = entry_string(entry)
redis.call('SET', KEYS[2], entry_s, 'EX', ARGV[5])
redis.call('ZADD', KEYS[3], ts, id)
local streamed = ARGV[11] == 'stream'
if streamed then
  redis.call('XADD', KEYS[5], '*', 'e', ledger_event_json(id, ARGV[12], entry))
end
if fingerprint ~= '' then
  redis.call('HSET', KEYS[4], 'fp', fingerprint, 'id', id, 'balance', balance_s, 'v', v_s,
    'state', streamed and 'done' or 'pending', 'ts', ts)
  redis.call('EXPIRE', KEYS[4], ARGV[7])
end
return {'ok', id, balance_s, v_s, h[6], open, tail}
