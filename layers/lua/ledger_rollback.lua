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
-- KEYS[7] user:held:{uid}               hash: a held credit taken back here leaves the held total too
-- ARGV[1] entry id  ARGV[2] fate TTL in seconds  ARGV[3] '1' when the key is counted (a client key), else ''
-- Returns:
--   {'gone'}                  nothing left to undo (already given back, or Redis lost it); tombstone set
--   {'rolled_back', balance, v}  money given back; the tombstone lets the writer skip it without asking the DB
--   {'rolled_back'}           entry removed but the account hash was lost; the DB never charged it
redis.call('SET', KEYS[4], 'rolledback', 'EX', ARGV[2])
local entry = redis.call('GET', KEYS[2])
if (not entry) or (not redis.call('ZSCORE', KEYS[3], ARGV[1])) then return {'gone'} end
local fields = {}
for part in string.gmatch(entry, '[^;]+') do fields[#fields + 1] = part end
local amount, kind = tonumber(fields[1]), fields[5]
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('HGET', KEYS[5], 'id') == ARGV[1] then
  redis.call('DEL', KEYS[5])
  if ARGV[3] == '1' and tonumber(redis.call('GET', KEYS[6]) or '0') > 0 then redis.call('DECR', KEYS[6]) end
end
local held = redis.call('HGET', KEYS[7], ARGV[1])
redis.call('HDEL', KEYS[7], ARGV[1])
local h = redis.call('HMGET', KEYS[1], 'balance', 'open')
if not h[1] then return {'rolled_back'} end
if held and redis.call('HINCRBY', KEYS[1], 'held', -tonumber(held)) <= 0 then redis.call('HDEL', KEYS[1], 'held') end
local open, balance = h[2]
if kind == 'D' then
  balance = redis.call('HINCRBY', KEYS[1], 'balance', amount)
  if balance > 0 and open == 'BALANCE' then open = '1' end
else
  balance = redis.call('HINCRBY', KEYS[1], 'balance', -amount)
  if balance <= 0 and open == '1' then open = 'BALANCE' end
end
local v = redis.call('HINCRBY', KEYS[1], 'v', 1)
redis.call('HSET', KEYS[1], 'open', open)
return {'rolled_back', string.format('%d', balance), string.format('%d', v)}
