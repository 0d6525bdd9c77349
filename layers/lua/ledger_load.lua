-- ledger_load: cache an account from the DB, only if it is not cached already
-- (a concurrent charge on the cached hash must never be overwritten by an older DB snapshot).
-- KEYS[1] user:balance:{uid}       hash
-- KEYS[2] user:held:{uid}          hash of what waits for its event to be durable (ledger_post): kept for the entries
--                                  still in flight (ARGV[10]: their credits stay unspendable, their captures keep the
--                                  hold from ending), the rest dropped (a Redis loss took them with it anyway)
-- KEYS[3] user:holds:{uid}         hash of the account's holds: replaced by the ACTIVE holds given here, with the
--                                  in-flight capture counts of the kept waits
-- KEYS[4] user:holds:expiry:{uid}  zset of ACTIVE hold ids by expires_at: replaced likewise
-- KEYS[5] user:refunds:{uid}       hash of refunded totals per charge: dropped (ledger_refund loads each again from
--                                  the DB and the pending refunds on first use)
-- KEYS[6] user:grants:{uid}        hash of the account's credit grants (lib/grants): replaced by those given here
-- KEYS[7] user:grants:expiry:{uid} zset of their ids by expires_at: replaced likewise
-- ARGV[1] balance (minor units)  ARGV[2] version  ARGV[3] threshold  ARGV[4] open ('1'|'BALANCE'|'ADMIN')
-- ARGV[5] mode ('ASYNC'|'SYNC')  ARGV[6] epoch: id of this load, stamped on every entry charged from it
-- ARGV[7] hold_until (epoch ms): a charge under an Idempotency-Key neither Redis nor the DB knows answers
--         'recovering' until then (0: no hold; ledger_apply)
-- ARGV[8] hold_log: 'await' or the log's offsets to wait for (outbox/log_hold.py), '' for no such hold
-- ARGV[9] on_hold: what the ACTIVE holds keep
-- ARGV[10] the ids of the pending entries the DB does not hold yet, comma-separated ('' for none): a reload while
--          they are in flight (an operator's change that failed half way dropped the cache) keeps what waits for them
-- ARGV[11] the grants with something left, 'id:remaining:expires_at:category,...' ('' for none)
-- ARGV[12..] hold id, record, expires_at for each ACTIVE hold
-- Returns 1 when loaded, 0 when the hash already existed.
--! include grants
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local waits = {}
for id in string.gmatch(ARGV[10], '[^,]+') do
  local waiting = redis.call('HGET', KEYS[2], id)
  if waiting then waits[#waits + 1] = {id, waiting} end
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
redis.call('HSET', KEYS[1], 'balance', ARGV[1], 'v', ARGV[2], 'threshold', ARGV[3],
  'open', ARGV[4], 'mode', ARGV[5], 'epoch', ARGV[6], 'grants', '0')
if tonumber(ARGV[7]) > 0 then redis.call('HSET', KEYS[1], 'hold_until', ARGV[7]) end
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'hold_log', ARGV[8]) end
if tonumber(ARGV[9]) > 0 then redis.call('HSET', KEYS[1], 'on_hold', ARGV[9]) end
for id, remaining, expires_at, category in string.gmatch(ARGV[11], '(%d+):(%d+):(%d+):([^,]+)') do
  grant_add(KEYS[1], KEYS[6], KEYS[7], id, tonumber(remaining), expires_at, category)
end
for i = 12, #ARGV, 3 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[4], ARGV[i + 2], ARGV[i])
end
local held = 0
for _, wait in ipairs(waits) do
  redis.call('HSET', KEYS[2], wait[1], wait[2])
  if string.sub(wait[2], 1, 1) == 'h' then
    redis.call('HINCRBY', KEYS[3], string.sub(wait[2], 2) .. ':inflight', 1)
  elseif string.sub(wait[2], 1, 1) == 'a' then
    redis.call('HSET', KEYS[3], string.sub(wait[2], 2) .. ':authorizing', '1')
  else
    held = held + tonumber(wait[2])
  end
end
if held > 0 then redis.call('HSET', KEYS[1], 'held', held) end
return 1
