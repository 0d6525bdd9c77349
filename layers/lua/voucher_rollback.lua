-- voucher_rollback: give back a voucher order whose event the broker did not acknowledge, unless the
-- writer claimed it already (then it was delivered and will be persisted).
-- KEYS[1] voucher:{v<id>}  KEYS[2] voucher:buyers:{v<id>}  KEYS[3] voucher:pending:{v<id>}
-- KEYS[4] voucher:fate:{v<id>}:<order id>   'claimed' (writer) | 'rolledback' (this script)
-- ARGV[1] order id  ARGV[2] user id  ARGV[3] fate TTL in seconds
-- Returns {'claimed'}, {'gone'} (nothing left to undo; tombstone set) or {'rolled_back'}.
if redis.call('GET', KEYS[4]) == 'claimed' then return {'claimed'} end
redis.call('SET', KEYS[4], 'rolledback', 'EX', ARGV[3])
if redis.call('HDEL', KEYS[3], ARGV[1]) == 0 then return {'gone'} end
redis.call('HINCRBY', KEYS[1], 'stock', 1)
if redis.call('HINCRBY', KEYS[2], ARGV[2], -1) <= 0 then redis.call('HDEL', KEYS[2], ARGV[2]) end
return {'rolled_back'}
