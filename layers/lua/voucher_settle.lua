-- voucher_settle: after the writer's DB commit, drop persisted orders from the pending hash. An order
-- taken from an earlier load (Redis lost the voucher and rebuilt it from the DB before this order
-- reached the DB) was not counted by the rebuilt stock: it is counted now, exactly once.
-- KEYS[1] voucher:{v<id>}  KEYS[2] voucher:buyers:{v<id>}  KEYS[3] voucher:pending:{v<id>}
-- ARGV[1] the DB row version this commit produced
-- ARGV[2..] order id, user id, epoch: triples of the orders just persisted
-- Returns {removed from pending, counted late}.
-- Resend evidence: redis-py resends a voucher_order whose reply was lost, up to RETRY_HORIZON_S
-- (dal/redis_store.py) later, while the writer may persist and settle the order within milliseconds. A settled
-- order is appended to its buyer's '<user id>:settled' field in KEYS[2] (',order;seq;epoch'), where voucher_order
-- finds it and answers the resend instead of taking a second unit (TigerBeetle keeps each client's last reply to
-- answer its resends). It is bounded by the per-user limit and lives as long as the buyers hash (the sale, plus
-- FINISHED_KEYS_TTL_S; a rebuild after a Redis loss starts it afresh).
local removed, late = 0, 0
local h = redis.call('HMGET', KEYS[1], 'epoch', 'db_version')
for i = 2, #ARGV, 3 do
  local pending = redis.call('HGET', KEYS[3], ARGV[i])
  if pending then
    redis.call('HDEL', KEYS[3], ARGV[i])
    local seq, epoch = string.match(pending, '^[^;]*;([^;]*);[^;]*;([^;]*)')
    redis.call('HSET', KEYS[2], ARGV[i + 1] .. ':settled',
      (redis.call('HGET', KEYS[2], ARGV[i + 1] .. ':settled') or '') .. ',' .. ARGV[i] .. ';' .. seq .. ';' .. epoch)
    removed = removed + 1
  elseif h[1] and ARGV[i + 2] ~= h[1] and tonumber(ARGV[1]) > tonumber(h[2]) then
    redis.call('HINCRBY', KEYS[1], 'stock', -1)
    redis.call('HINCRBY', KEYS[2], ARGV[i + 1], 1)
    late = late + 1
  end
end
return {removed, late}
