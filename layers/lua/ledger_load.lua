-- ledger_load: cache an account from the DB, only if it is not cached already
-- (a concurrent charge on the cached hash must never be overwritten by an older DB snapshot).
-- KEYS[1] user:balance:{uid}  hash
-- KEYS[2] user:held:{uid}     hash of held credits: dropped with a new load (the DB's balance holds no credit that
--                             is not durable, and the held ones it does not hold yet are not in this balance)
-- ARGV[1] balance (minor units)  ARGV[2] version  ARGV[3] threshold  ARGV[4] open ('1'|'BALANCE'|'ADMIN')
-- ARGV[5] mode ('ASYNC'|'SYNC')  ARGV[6] epoch: id of this load, stamped on every entry charged from it
-- Returns 1 when loaded, 0 when the hash already existed.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'balance', ARGV[1], 'v', ARGV[2], 'threshold', ARGV[3],
  'open', ARGV[4], 'mode', ARGV[5], 'epoch', ARGV[6])
return 1
