-- ledger_refund: give back part or all of a charge (a deduct, or what a hold captured) as a credit of the account,
-- never more than was charged in total: the refunded total per charge is checked and raised in the same step as the
-- credit (a compare-and-set in the account's slot), so concurrent refunds and retries cannot pass it.
-- All keys share the {uid} hash tag (one Redis Cluster slot).
-- KEYS[1] user:balance:{uid}            hash: balance, v, open, mode, epoch, ts, held
-- KEYS[2] user:order:{uid}:<refund id>  the refund's entry string: the ledger's 8 fields (kind F), then
--                                       chargeId;chargeKind;refundedAfter;grantsRefunded;reason
-- KEYS[3] user:order:consistency:{uid}  zset: entry ids not yet in the DB
-- KEYS[4] user:refunds:{uid}            hash: charge id -> refunded total so far (loaded from the DB on first use)
-- KEYS[5] user:held:{uid}               hash: entry id -> amount of a credit not durable yet (a refund is a credit:
--                                       spendable once its event is durable, as a recharge)
-- KEYS[6] events:{s<n>}                 the event stream (written only when ARGV[5] is 'stream')
-- KEYS[7] user:grants:{uid}             hash (lib/grants): the grants the charge spent get their part back while live
-- KEYS[8] user:grants:expiry:{uid}      zset (lib/grants)
-- ARGV[1] amount (> 0)  ARGV[2] ts, epoch ms  ARGV[3] refund id  ARGV[4] entry key TTL in seconds
-- ARGV[5] 'stream' | ''  ARGV[6] user id  ARGV[7] charge id  ARGV[8] 'order' | 'hold'  ARGV[9] what was charged
-- ARGV[10] refunded so far as the DB and the pending entries know it, '' when the caller did not look
-- ARGV[11] largest balance allowed  ARGV[12] reason (any text)
-- ARGV[13] what the charge spent of the account's grants, '<grant id>:<spent>,...' in spend order ('' for none):
--          the refund gives back the plain balance first, then those grants last-spent first (lib/grants
--          grants_refund); the entry's grants_refunded says what went back to which live grant
-- Returns one of:
--   {'missing'}                        no cached account: load it, then retry
--   {'sync'}                           a SYNC account: refund in the DB instead
--   {'unknown_total'}                  KEYS[4] has no total for the charge and ARGV[10] is '': look it up, call again
--   {'exceeds', refunded, charged}     the refund would pass what was charged: nothing changed
--   {'limit', balance, v}              the credit would pass the largest balance: nothing changed
--   {'ok', balance, v, epoch, open, refunded, grants_refunded}  refunded; also when KEYS[2] exists (a resend: answered
--                                      as it was)
--! include grants
--! include event
local amount, ts, refund_id, charge = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[7]

local applied = redis.call('GET', KEYS[2])
if applied then
  local e = entry_fields(applied)
  return {'ok', e.balance_after, e.version, e.epoch, e.open, e.refunded_after, e.grants_refunded}
end

local h = redis.call('HMGET', KEYS[1], 'balance', 'v', 'open', 'mode', 'epoch')
if not h[1] then return {'missing'} end
if h[4] == 'SYNC' then return {'sync'} end
local refunded = redis.call('HGET', KEYS[4], charge)
if not refunded then
  if ARGV[10] == '' then return {'unknown_total'} end
  refunded = ARGV[10]
end
refunded = tonumber(refunded)
if refunded + amount > tonumber(ARGV[9]) then
  return {'exceeds', string.format('%d', refunded), ARGV[9]}
end
local balance = tonumber(h[1])
if balance + amount > tonumber(ARGV[11]) then return {'limit', h[1], h[2]} end

local given = ''  -- what went back to the charge's live grants
if (ARGV[13] or '') ~= '' then
  given = grants_refund(KEYS[7], ARGV[13], tonumber(ARGV[9]), refunded, amount, ts)
end
balance = redis.call('HINCRBY', KEYS[1], 'balance', amount)
local open = h[3]
if balance > 0 and open == 'BALANCE' then open = '1' end
local streamed = ARGV[5] == 'stream'
if not streamed then  -- streamed, the event is durable in this very step
  redis.call('HSET', KEYS[5], refund_id, ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'held', amount)
end
local refunded_s = string.format('%d', refunded + amount)
redis.call('HSET', KEYS[4], charge, refunded_s)
local v = redis.call('HINCRBY', KEYS[1], 'v', 1)
local balance_s, v_s = string.format('%d', balance), string.format('%d', v)
redis.call('HSET', KEYS[1], 'ts', ts, 'open', open)
local entry = {amount = ARGV[1], ts = ts, balance_after = balance_s, version = v_s, kind = 'F', epoch = h[5],
  open = open, idem_key = '', refund_of = charge, refund_of_kind = ARGV[8], refunded_after = refunded_s,
  grants_refunded = given, reason = ARGV[12]}
redis.call('SET', KEYS[2], entry_string(entry), 'EX', ARGV[4])
redis.call('ZADD', KEYS[3], ts, refund_id)
if streamed then redis.call('XADD', KEYS[6], '*', 'e', ledger_event_json(refund_id, ARGV[6], entry)) end
return {'ok', balance_s, v_s, h[5], open, refunded_s, given}
