-- redpacket_settle: after the writer's DB commit, drop persisted claims from the pending hash. A claim
-- grabbed before Redis lost the packet (and reached the DB after the rebuild) may have been put back
-- into the unclaimed list by the rebuild: it is taken out and its grabber recorded, exactly once.
-- KEYS[1] rp:unclaimed:{rp<id>}  KEYS[2] rp:grabbers:{rp<id>}  KEYS[3] rp:pending:{rp<id>}
-- ARGV[1..] item id, user id, amount, ts: quadruples of the claims just persisted
-- Returns {removed from pending, taken out of the unclaimed list}.
local removed, late = 0, 0
for i = 1, #ARGV, 4 do
  if redis.call('HDEL', KEYS[3], ARGV[i]) == 1 then
    removed = removed + 1
  elseif redis.call('LREM', KEYS[1], 0, ARGV[i] .. ';' .. ARGV[i + 2]) > 0 then
    redis.call('HSETNX', KEYS[2], ARGV[i + 1], ARGV[i] .. ';' .. ARGV[i + 2] .. ';' .. ARGV[i + 3] .. ';')
    late = late + 1
  end
end
return {removed, late}
