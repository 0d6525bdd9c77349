-- redpacket_rollback: put back a grab whose claim event the broker did not acknowledge, unless the
-- writer claimed it already (then it was delivered and will be persisted).
-- KEYS[1] rp:unclaimed:{rp<id>}  KEYS[2] rp:grabbers:{rp<id>}  KEYS[3] rp:pending:{rp<id>}
-- KEYS[4] rp:fate:{rp<id>}:<grab id>   'claimed' (writer) | 'rolledback' (this script)
-- ARGV[1] item id  ARGV[2] user id  ARGV[3] amount  ARGV[4] fate TTL in seconds
-- Returns {'claimed'}, {'gone'} (nothing left to undo; tombstone set) or {'rolled_back'}.
if redis.call('GET', KEYS[4]) == 'claimed' then return {'claimed'} end
redis.call('SET', KEYS[4], 'rolledback', 'EX', ARGV[4])
if redis.call('HDEL', KEYS[3], ARGV[1]) == 0 then return {'gone'} end
redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('LPUSH', KEYS[1], ARGV[1] .. ';' .. ARGV[3])
return {'rolled_back'}
