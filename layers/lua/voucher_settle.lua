-- voucher_settle: after the writer's DB commit, drop persisted orders from the pending hash. An order
-- taken from an earlier load (Redis lost the voucher and rebuilt it from the DB before this order
-- reached the DB) was not counted by the rebuilt stock: it is counted now, exactly once.
-- KEYS[1] voucher:{v<id>}  KEYS[2] voucher:buyers:{v<id>}  KEYS[3] voucher:pending:{v<id>}
-- ARGV[1] the DB row version this commit produced
-- ARGV[2..] order id, user id, epoch: triples of the orders just persisted
-- Returns {removed from pending, counted late}.
local removed, late = 0, 0
local h = redis.call('HMGET', KEYS[1], 'epoch', 'db_version')
for i = 2, #ARGV, 3 do
  if redis.call('HDEL', KEYS[3], ARGV[i]) == 1 then
    removed = removed + 1
  elseif h[1] and ARGV[i + 2] ~= h[1] and tonumber(ARGV[1]) > tonumber(h[2]) then
    redis.call('HINCRBY', KEYS[1], 'stock', -1)
    redis.call('HINCRBY', KEYS[2], ARGV[i + 1], 1)
    late = late + 1
  end
end
return {removed, late}
