-- voucher_settle: after the writer's DB commit, drop persisted orders from this bucket's pending and away hashes.
-- An order taken from an earlier load (Redis lost the bucket and rebuilt it from the DB before this order reached
-- the DB) was not counted by the rebuilt bucket: it is counted now, exactly once.
-- KEYS[1] voucher:{v<id>[:b<k>]}  KEYS[2] voucher:buyers:{..}  KEYS[3] voucher:pending:{..}  KEYS[4] voucher:away:{..}
-- ARGV[1] the DB row version this commit produced (0: a re-delivery, counts nothing late)
-- ARGV[2..] order id, user id, epoch, role, unit bucket: quintuples of the orders just persisted. role: 'own' (unit
--           and buyer here), 'unit' (unit here, buyer's home elsewhere), 'buyer' (home here, unit elsewhere)
-- Returns {removed from pending or away, counted late}.
-- Resend evidence: redis-py resends a voucher_order or voucher_take whose reply was lost, up to RETRY_HORIZON_S
-- (dal/redis_store.py) later, while the writer may persist and settle the order within milliseconds. A settled
-- order is appended to its buyer's '<user id>:settled' field in KEYS[2] (',order;seq;epoch;bucket'), in the unit's
-- bucket and in the buyer's home, where voucher_order / voucher_take find it and answer the resend instead of taking
-- a second unit (TigerBeetle keeps each client's last reply to answer its resends). It is bounded by the per-user
-- limit and lives as long as the buyers hash (the sale, plus FINISHED_KEYS_TTL_S; a rebuild starts it afresh).
local removed, late = 0, 0
local h = redis.call('HMGET', KEYS[1], 'epoch', 'db_version')
local function evidence(user, order, seq, epoch, bucket)
  redis.call('HSET', KEYS[2], user .. ':settled',
    (redis.call('HGET', KEYS[2], user .. ':settled') or '') .. ',' .. order .. ';' .. seq .. ';' .. epoch .. ';' .. bucket)
end
for i = 2, #ARGV, 5 do
  local order, user, epoch, role, bucket = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  if role == 'buyer' then
    local away = redis.call('HGET', KEYS[4], order)
    if away then
      redis.call('HDEL', KEYS[4], order)
      evidence(user, order, string.match(away, '^[^;]*;([^;]*)'), epoch, bucket)
      removed = removed + 1
    elseif h[2] and tonumber(ARGV[1]) > tonumber(h[2]) then  -- the home was rebuilt before the commit
      redis.call('HINCRBY', KEYS[2], user, 1)
      late = late + 1
    end
  else
    local pending = redis.call('HGET', KEYS[3], order)
    if pending then
      redis.call('HDEL', KEYS[3], order)
      local seq, pending_epoch = string.match(pending, '^[^;]*;([^;]*);[^;]*;([^;]*)')
      evidence(user, order, seq, pending_epoch, bucket)
      removed = removed + 1
    elseif h[1] and epoch ~= h[1] and tonumber(ARGV[1]) > tonumber(h[2]) then
      redis.call('HINCRBY', KEYS[1], 'stock', -1)
      if role == 'own' then redis.call('HINCRBY', KEYS[2], user, 1) end
      late = late + 1
    end
  end
end
return {removed, late}
