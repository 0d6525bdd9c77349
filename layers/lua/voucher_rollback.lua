-- voucher_rollback: give back a voucher order whose event the broker did not acknowledge. Run only once the DB
-- recorded the order as rolled back (t_rolled_back, under the voucher row lock: VoucherDb.record_rollback), by the
-- API before it answers PUBLISH_FAILED, or by the writer/reconciler that meets such an order still pending. The
-- DB is the arbiter, so a 'claimed' fate does not stop it (that writer will skip the order).
-- Runs in the bucket the unit came from; an order whose buyer's home is another bucket gets its slot back there
-- (voucher_release 'give_back').
-- KEYS[1] voucher:{v<id>[:b<k>]}  KEYS[2] voucher:buyers:{..}  KEYS[3] voucher:pending:{..}
-- KEYS[4] voucher:fate:{..}:<order id>   'claimed' (writer) | 'rolledback' (this script)
-- ARGV[1] order id  ARGV[2] user id  ARGV[3] fate TTL in seconds
-- ARGV[4] '1' when this bucket is the buyer's home (the slot is given back here too), '' when not
-- Returns {'gone'} (nothing left to undo; tombstone set) or {'rolled_back'}.
redis.call('SET', KEYS[4], 'rolledback', 'EX', ARGV[3])
if redis.call('HDEL', KEYS[3], ARGV[1]) == 0 then return {'gone'} end
redis.call('HINCRBY', KEYS[1], 'stock', 1)
if ARGV[4] == '1' and redis.call('HINCRBY', KEYS[2], ARGV[2], -1) <= 0 then redis.call('HDEL', KEYS[2], ARGV[2]) end
return {'rolled_back'}
