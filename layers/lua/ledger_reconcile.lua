-- ledger_reconcile: correct the cached balance by an adjusting amount (the drift), never by overwriting it.
-- The caller holds the account's DB row lock (no writer commits meanwhile) and computed the drift from one atomic
-- snapshot of the hash and the pending set: drift = DB balance + pending entries the DB lacks - cached balance.
-- Charges and rollbacks made since the snapshot moved the cached balance and the pending set by the same amount,
-- so the drift still holds and adding it converges however hot the account is (TigerBeetle: balances change only
-- by posted amounts; a correction is one more posting). Only a reload of the hash (another epoch) or a switch to
-- SYNC, which set the balance anew, void it.
-- KEYS[1] user:balance:{uid}  hash
-- ARGV[1] epoch of the snapshot ('' when the hash had none)  ARGV[2] drift, signed integer (minor units)
-- ARGV[3] DB version
-- Returns {'ok', new v} when corrected, {'same'} when the drift is 0 and the version not behind the DB (the 'dirty'
-- flag is cleared in both cases), or {'changed'} when the hash vanished, was reloaded or turned SYNC: next run.
local h = redis.call('HMGET', KEYS[1], 'v', 'open', 'epoch', 'mode')
if (not h[1]) or (h[3] or '') ~= ARGV[1] or h[4] == 'SYNC' then return {'changed'} end
if tonumber(ARGV[2]) == 0 and tonumber(h[1]) >= tonumber(ARGV[3]) then
  redis.call('HDEL', KEYS[1], 'dirty')
  return {'same'}
end
local balance = redis.call('HINCRBY', KEYS[1], 'balance', ARGV[2])
local v = math.max(tonumber(h[1]), tonumber(ARGV[3])) + 1
local open = h[2]
if balance <= 0 and open == '1' then open = 'BALANCE' elseif balance > 0 and open == 'BALANCE' then open = '1' end
redis.call('HSET', KEYS[1], 'v', string.format('%d', v), 'open', open)
redis.call('HDEL', KEYS[1], 'dirty')
return {'ok', string.format('%d', v)}
