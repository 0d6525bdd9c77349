-- voucher_rollback: give back a voucher order whose event the broker did not acknowledge. Run only once the DB
-- recorded the order as rolled back (t_rolled_back, under the voucher row lock: VoucherDb.record_rollback), by the
-- API before it answers PUBLISH_FAILED, or by the writer/reconciler that meets such an order still pending. The
-- DB is the arbiter, so a 'claimed' fate does not stop it (that writer will skip the order).
-- KEYS[1] voucher:{v<id>}  KEYS[2] voucher:buyers:{v<id>}  KEYS[3] voucher:pending:{v<id>}
-- KEYS[4] voucher:fate:{v<id>}:<order id>   'claimed' (writer) | 'rolledback' (this script)
-- ARGV[1] order id  ARGV[2] user id  ARGV[3] fate TTL in seconds
-- Returns {'gone'} (nothing left to undo; tombstone set) or {'rolled_back'}.
redis.call('SET', KEYS[4], 'rolledback', 'EX', ARGV[3])
if redis.call('HDEL', KEYS[3], ARGV[1]) == 0 then return {'gone'} end
redis.call('HINCRBY', KEYS[1], 'stock', 1)
if redis.call('HINCRBY', KEYS[2], ARGV[2], -1) <= 0 then redis.call('HDEL', KEYS[2], ARGV[2]) end
return {'rolled_back'}
