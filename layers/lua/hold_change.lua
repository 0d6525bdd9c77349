-- hold_change: one change of a hold, a compare-and-set on its state in the account's slot: authorize (H: what it
-- holds leaves `available` = balance - held credits - live holds at once, the balance stays), capture (C: the balance
-- goes down by what is captured, in parts or the rest), void (V) or expire (X); V, X and a final capture release what
-- is left. Each is one ledger entry. All keys share the {uid} hash tag (one Redis Cluster slot).
-- KEYS[1] user:balance:{uid}           hash: balance, v, threshold, open, mode, epoch, ts, held, on_hold (what the
--                                      ACTIVE holds keep, expired ones included until they are tidied)
-- KEYS[2] user:order:{uid}:<entry id>  this change's entry string (keys.entry: the ledger's 8 fields, then
--                                      holdId;released;expiresAt;availableAfter;stateAfter, then the description (H)
--                                      or '' and the captured total after (C, V, X)); an authorize's id is the hold's
-- KEYS[3] user:order:consistency:{uid} zset: entry ids not yet in the DB
-- KEYS[4] user:holds:{uid}             hash: hold id -> 'amount;captured;state;expiresAt;createdAt;description',
--                                      '<hold id>:inflight' -> captures not durable yet
-- KEYS[5] user:holds:expiry:{uid}      zset: ACTIVE hold ids by expires_at
-- KEYS[6] user:held:{uid}              hash: entry id -> what waits for the entry to be durable ('h<hold id>' for a
--                                      capture: ledger_post, ledger_settle and ledger_rollback end its inflight count;
--                                      'a<hold id>' for an authorize: they end the hold's ':authorizing' mark)
-- KEYS[7] events:{s<n>}                the event stream (written only when ARGV[8] is 'stream')
-- KEYS[8] user:grants:{uid}             hash (lib/grants): what expired grants still hold is not authorized, captured
--                                      or counted in any change's available_after; a capture spends the live grants
--                                      first-to-expire (those live at capture time), then the plain balance
-- KEYS[9] user:grants:expiry:{uid}      zset (lib/grants)
-- ARGV[1] 'H' | 'C' | 'V' | 'X'  ARGV[2] amount (H: > 0; C: '' or '0' for the rest; V, X: '')  ARGV[3] '1': a final C
-- ARGV[4] ts, epoch ms (the caller's clock; the script's own TIME when that is later: every decision about time is
--         made by one clock, never one read before the call stalled)   ARGV[5] entry id  ARGV[6] hold id (H: the entry id)  ARGV[7] entry key TTL in seconds
-- ARGV[8] 'stream' | ''  ARGV[9] user id  ARGV[10] most pending entries ('' or '0': no bound)
-- ARGV[11] H: expires_at, epoch ms  ARGV[12] H: description (any text)
-- Returns one of:
--   {'missing'}                       no cached account: load it, then retry
--   {'sync'}                          a SYNC account: the DB decides instead
--   {'closed', balance, v}            H on a closed API
--   {'insufficient', balance, v}      H with available - amount below the threshold; C that would take what grants
--                                     that expired while the hold was open still hold (available with this hold's
--                                     remaining counted free, less what is captured, below the threshold)
--   {'not_found'}                     C, V, X: Redis holds no such hold (look in the DB: it may have ended and been
--                                     settled)
--   {'ended', state}                  the hold is CAPTURED, VOIDED or EXPIRED already: nothing changed
--   {'expired'}                       C or V on a hold past its expires_at: nothing changed (the expiry releases it)
--   {'not_due'}                       X on a hold not past its expires_at yet: nothing changed
--   {'exceeds', remaining}            C of more than is left on the hold: nothing changed
--   {'busy'}                          V, X or a final C while a capture's event is not durable yet, or any C, V, X
--                                     while the hold's authorize is not (it may yet be taken back): retry shortly
--   {'too_many_pending'}              the account's entries are not reaching the DB: nothing changed
--   {'recovering', until}             C, V, X on an account rebuilt after a Redis loss whose own records may still be
--                                     on their way to the DB (ledger_load's hold_until, outbox/log_hold.py): the hold
--                                     may be captured or ended there already; nothing changed, retry after `until`
--   {'held', until}                   as 'recovering', past hold_until while hold_log is set: this caller checks the
--                                     writer's watermark and, once it is past, loads the account again; the others
--                                     answer 'recovering' for a second
--   {'ok', balance, v, epoch, open, available, amount, captured, state, released, expires_at, grants_spent}
--                                     changed (grants_spent: a capture's '<grant id>:<spent>,...', else ''); also when
--                                     KEYS[2] exists (a resend after a lost reply: answered as it was, nothing twice)
--! include rebuild_hold
--! include grants
--! include holds
--! include event
local op, ts, entry_id, hold_id = ARGV[1], ARGV[4], ARGV[5], ARGV[6]
local clock = redis.call('TIME')
local script_now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
if script_now > tonumber(ts) then ts = string.format('%d', script_now) end

local applied = redis.call('GET', KEYS[2])
if applied then
  local e = entry_fields(applied)
  return {'ok', e.balance_after, e.version, e.epoch, e.open, e.available_after, e.amount, e.captured_after or '0',
    e.hold_state, e.released, e.expires_at, e.grants_spent or ''}
end

local h = redis.call('HMGET', KEYS[1], 'balance', 'v', 'threshold', 'open', 'mode', 'epoch', 'held', 'on_hold',
  'hold_until', 'hold_log', 'grants')
if not h[1] then return {'missing'} end
if h[5] == 'SYNC' then return {'sync'} end
local balance, held, now = tonumber(h[1]), tonumber(h[7]) or 0, tonumber(ts)
-- a hold of an account rebuilt after a Redis loss is the DB's: a capture or end still on its way there is not in it
if op ~= 'H' then
  local held = rebuild_hold(KEYS[1], h[9], h[10], now)
  if held then return held end
end
local max_pending = tonumber(ARGV[10] or '') or 0

local amount, captured, state, expires_at, r
local take, released, terminal, new_state = 0, 0, false, 'ACTIVE'
-- only accounts with grants pay for them (lib/grants: the hash's grants field)
local has_grants = h[11] == '1' or (not h[11] and grants_looked_up(KEYS[1], KEYS[9]))
local expired = has_grants and grants_expired(KEYS[8], KEYS[9], ts) or 0
held = held + expired  -- out of reach like a held credit, until its expiry entry
if op == 'H' then
  amount, captured, expires_at = tonumber(ARGV[2]), 0, ARGV[11]
  if h[4] ~= '1' then return {'closed', h[1], h[2]} end
  if balance - held - live_holds(tonumber(h[8]) or 0, KEYS[4], KEYS[5], ts) - amount < tonumber(h[3]) then return {'insufficient', h[1], h[2]} end
  if max_pending > 0 and redis.call('ZCARD', KEYS[3]) >= max_pending then return {'too_many_pending'} end
  r = {ARGV[2], '0', 'ACTIVE', expires_at, ts, ARGV[12]}
else
  local rec = redis.call('HGET', KEYS[4], hold_id)
  if not rec then return {'not_found'} end
  r = hold_fields(rec)
  amount, captured, state, expires_at = tonumber(r[1]), tonumber(r[2]), r[3], r[4]
  if state ~= 'ACTIVE' then return {'ended', state} end
  if op == 'X' then
    if now < tonumber(expires_at) then return {'not_due'} end
  elseif now >= tonumber(expires_at) then
    return {'expired'}
  end
  local remaining = amount - captured
  terminal = op ~= 'C'
  if op == 'C' then
    take = tonumber(ARGV[2]) or 0
    if take == 0 then take = remaining end
    if take > remaining then return {'exceeds', string.format('%d', remaining)} end
    terminal = ARGV[3] == '1' or take == remaining
  end
  if terminal and (tonumber(redis.call('HGET', KEYS[4], hold_id .. ':inflight')) or 0) > 0 then return {'busy'} end
  -- a hold whose authorize may still be taken back (its publish failed) is no hold to capture from yet
  if redis.call('HEXISTS', KEYS[4], hold_id .. ':authorizing') == 1 then return {'busy'} end
  -- grants the hold was placed against that expired meanwhile are not there to capture: with the hold's own
  -- remaining counted free, a capture may take the account no lower than a deduct could
  if take > 0 and expired > 0 and
    balance - held - (live_holds(tonumber(h[8]) or 0, KEYS[4], KEYS[5], ts) - remaining) - take < tonumber(h[3]) then
    return {'insufficient', h[1], h[2]}
  end
  if max_pending > 0 and redis.call('ZCARD', KEYS[3]) >= max_pending then return {'too_many_pending'} end
  captured = captured + take
  released = terminal and (amount - captured) or 0
  if terminal then new_state = (op == 'V' and 'VOIDED') or (op == 'X' and 'EXPIRED') or 'CAPTURED' end
  r[2], r[3] = string.format('%d', captured), new_state
end

local open = h[4]
local spent = ''  -- what a capture spent of the account's live grants
if take > 0 then
  if has_grants then spent = grants_spend(KEYS[8], KEYS[9], KEYS[6], ts, take) end
  balance = redis.call('HINCRBY', KEYS[1], 'balance', -take)
  if balance <= 0 and open == '1' then open = 'BALANCE' end
end
local on_hold = redis.call('HINCRBY', KEYS[1], 'on_hold', op == 'H' and amount or -(take + released))
if on_hold <= 0 then redis.call('HDEL', KEYS[1], 'on_hold') end
local v = redis.call('HINCRBY', KEYS[1], 'v', 1)
redis.call('HSET', KEYS[1], 'ts', ts, 'open', open)
redis.call('HSET', KEYS[4], hold_id, hold_string(r))
if op == 'H' then redis.call('ZADD', KEYS[5], expires_at, hold_id) end
if terminal then redis.call('ZREM', KEYS[5], hold_id) end
local streamed = ARGV[8] == 'stream'
if op == 'C' and not terminal and not streamed then  -- durable only once the broker has it: no terminal change before
  redis.call('HSET', KEYS[6], entry_id, 'h' .. hold_id)
  redis.call('HINCRBY', KEYS[4], hold_id .. ':inflight', 1)
elseif op == 'H' and not streamed then  -- no change of the hold until its authorize is durable
  redis.call('HSET', KEYS[6], entry_id, 'a' .. hold_id)
  redis.call('HSET', KEYS[4], hold_id .. ':authorizing', '1')
end

local entry_amount = (op == 'H' and amount) or (op == 'C' and take) or released
local balance_s, v_s = string.format('%d', balance), string.format('%d', v)
local available_s = string.format('%d', balance - held - live_holds(math.max(on_hold, 0), KEYS[4], KEYS[5], ts))
local entry = {amount = string.format('%d', entry_amount), ts = ts, balance_after = balance_s, version = v_s, kind = op,
  epoch = h[6], open = open, idem_key = '', hold_id = hold_id, released = string.format('%d', released),
  expires_at = expires_at, available_after = available_s, hold_state = new_state, description = ARGV[12],
  captured_after = r[2], grants_spent = spent}
redis.call('SET', KEYS[2], entry_string(entry), 'EX', ARGV[7])
redis.call('ZADD', KEYS[3], ts, entry_id)
if streamed then redis.call('XADD', KEYS[7], '*', 'e', ledger_event_json(entry_id, ARGV[9], entry)) end
return {'ok', balance_s, v_s, h[6], open, available_s, entry.amount, r[2], new_state, entry.released, expires_at,
  spent}
