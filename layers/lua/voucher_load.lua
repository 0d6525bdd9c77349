-- voucher_load: put a flash-sale voucher's stock bucket into Redis from the DB, only if Redis does not hold it
-- (a concurrent order on the live hash must never be overwritten by an older DB snapshot).
-- All keys share the bucket's hash tag ({v<id>} for bucket 0, {v<id>:b<k>} for bucket k).
-- KEYS[1] voucher:{v<id>}          hash: stock, begin, end, limit, epoch, hold_until, db_version, hold_log
-- KEYS[2] voucher:buyers:{v<id>}   hash: user id -> orders taken
-- KEYS[3] voucher:away:{v<id>}     hash: reservations of buyers whose unit comes from another bucket (emptied: the
--                                  buyers loaded are the DB's)
-- ARGV[1] the bucket's stock left in the DB  ARGV[2] begin (epoch ms)  ARGV[3] end (epoch ms)  ARGV[4] per-user limit
-- ARGV[5] epoch: id of this load, stamped on every order taken from it
-- ARGV[6] hold_until (epoch ms): orders answer 'recovering' until then (0 for a new voucher)
-- ARGV[7] the DB row's version when read (orders the DB commits later are not in ARGV[1])
-- ARGV[8] hold_log: 'await' when orders wait for the writer to apply the log as it is now (outbox/log_hold.py),
--         '' for no such hold
-- ARGV[9..] user id, orders taken: pairs from the DB, of the buyers whose home is this bucket
-- Returns 1 when loaded, 0 when the hash already existed.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'begin', ARGV[2], 'end', ARGV[3], 'limit', ARGV[4],
  'epoch', ARGV[5], 'hold_until', ARGV[6], 'db_version', ARGV[7])
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'hold_log', ARGV[8]) end
for i = 9, #ARGV, 2000 do
  redis.call('HSET', KEYS[2], unpack(ARGV, i, math.min(i + 1999, #ARGV)))
end
return 1
