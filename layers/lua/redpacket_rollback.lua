-- redpacket_rollback: put back a grab whose claim event the broker did not acknowledge. Run only once the DB
-- recorded the grab as rolled back (t_rolled_back, under the writer's locks: PacketTx.record_rollback), by the
-- API before it answers PUBLISH_FAILED, or by the writer/reconciler that meets such a grab still pending. The DB
-- is the arbiter, so a 'claimed' fate does not stop it (that writer will skip the claim).
-- KEYS[1] rp:unclaimed:{rp<id>}  KEYS[2] rp:grabbers:{rp<id>}  KEYS[3] rp:pending:{rp<id>}
-- KEYS[4] rp:fate:{rp<id>}:<grab id>   'claimed' (writer) | 'rolledback' (this script)
-- ARGV[1] item id  ARGV[2] user id  ARGV[3] amount  ARGV[4] fate TTL in seconds
-- Returns {'gone'} (nothing left to undo; tombstone set) or {'rolled_back'}.
redis.call('SET', KEYS[4], 'rolledback', 'EX', ARGV[4])
if redis.call('HDEL', KEYS[3], ARGV[1]) == 0 then return {'gone'} end
redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('LPUSH', KEYS[1], ARGV[1] .. ';' .. ARGV[3])
return {'rolled_back'}
