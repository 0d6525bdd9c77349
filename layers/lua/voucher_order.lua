-- voucher_order: take one unit of a flash-sale voucher for a buyer, atomically, in the buyer's home bucket.
-- All keys share the home bucket's hash tag (the seed built keys inside Lua, which Redis Cluster forbids).
-- A voucher sells from stock_shards buckets (one slot each); the buyer's record (orders taken) lives in the home
-- bucket only, so the per-user limit is one slot's check. When the home bucket is empty, the buyer's slot is reserved
-- here (buyers + 1, an 'away' record) and the service takes the unit from another bucket (voucher_take), or gives the
-- reservation back (voucher_release) when none has one.
-- KEYS[1] voucher:{v<id>[:b<k>]}         hash: stock, begin, end, limit, epoch, hold_until, db_version, hold_log,
--                                        dry:<k> (bucket k seen empty until, epoch ms)
-- KEYS[2] voucher:buyers:{..}  hash: user id -> orders taken; '<user id>:settled' -> ',order;seq;epoch;bucket...' of
--                              the buyer's persisted orders (voucher_settle: resend evidence)
-- KEYS[3] voucher:pending:{..} hash: order id -> 'user;seq;ts;epoch;home' until the writer persisted it
-- KEYS[4] events:{s<n>}        event stream (written only when ARGV[5] is 'stream')
-- KEYS[5] voucher:away:{..}    hash: order id -> 'user;seq;ts' while its unit is taken from another bucket
-- ARGV[1] voucher id  ARGV[2] user id  ARGV[3] order id (decimal string)  ARGV[4] now (epoch ms)
-- ARGV[5] 'stream' to XADD the order event here (Redis Streams transport), '' for Kafka
-- ARGV[6] this (home) bucket  ARGV[7] the voucher's bucket count (1: no other bucket to fall over to)
-- Returns one of:
--   {'missing'}              Redis does not hold the bucket: load it from the DB, then retry
--   {'not_started', begin}   {'ended', end}
--   {'recovering', until}    rebuilt after Redis lost it: orders wait until then
--   {'held', until}          rebuilt, and waiting for the writer to apply the log (hold_log): this caller checks
--                            (outbox/log_hold.py) and lifts it or answers RECOVERING; the others wait until `until`
--   {'sold_out'}             stock <= 0 here, and every other bucket seen empty within the last second
--   {'already', taken}       the buyer holds the per-user limit already
--   {'ok', seq, epoch, stock_left, bucket}  taken (here: bucket = ARGV[6]): seq is the buyer's n-th order of this
--                            voucher. Also the answer to a resent call whose order id is pending already, or
--                            persisted (nothing taken twice; bucket: where its unit came from)
--   {'away', seq, b1, b2..}  the buyer's slot seq is reserved here (also for a resent call): take the unit from the
--                            first of buckets b1, b2.. (not seen empty) that has one
--! include event
local pending = redis.call('HGET', KEYS[3], ARGV[3])
if pending then
  local f = {}
  for part in string.gmatch(pending, '[^;]+') do f[#f + 1] = part end
  return {'ok', f[2], f[4], redis.call('HGET', KEYS[1], 'stock'), ARGV[6]}
end
-- a resend arriving after the writer persisted and settled the order: voucher_settle left it with the buyer
local settled = redis.call('HGET', KEYS[2], ARGV[2] .. ':settled')
if settled then
  local seq, epoch, bucket = string.match(settled, ',' .. ARGV[3] .. ';(%d+);([^;,]*);?(%d*)')
  if seq then return {'ok', seq, epoch, redis.call('HGET', KEYS[1], 'stock'), bucket ~= '' and bucket or ARGV[6]} end
end
local shards, home, now = tonumber(ARGV[7]), tonumber(ARGV[6]), tonumber(ARGV[4])
local function others()  -- the other buckets, from the next one on, less those seen empty within the last second
  local list = {}
  for i = 1, shards - 1 do
    local b = (home + i) % shards
    if tonumber(redis.call('HGET', KEYS[1], 'dry:' .. b) or '0') <= now then list[#list + 1] = b end
  end
  return list
end
local away = redis.call('HGET', KEYS[5], ARGV[3])
if away then
  local list = others()
  table.insert(list, 1, string.match(away, '^[^;]*;([^;]*)'))
  return {'away', unpack(list)}
end
local v = redis.call('HMGET', KEYS[1], 'stock', 'begin', 'end', 'limit', 'epoch', 'hold_until', 'hold_log')
if not v[1] then return {'missing'} end
if now < tonumber(v[2]) then return {'not_started', v[2]} end
if now >= tonumber(v[3]) then return {'ended', v[3]} end
if now < tonumber(v[6]) then return {'recovering', v[6]} end  -- only a sale still on needs orders in flight to land
if v[7] then  -- one caller a second checks the writer's watermark
  redis.call('HSET', KEYS[1], 'hold_until', now + 1000)
  return {'held', now + 1000}
end
local elsewhere = {}
if tonumber(v[1]) <= 0 then
  elsewhere = others()
  if #elsewhere == 0 then return {'sold_out'} end
end
local taken = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
if taken >= tonumber(v[4]) then return {'already', taken} end
local seq = redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
if #elsewhere > 0 then
  redis.call('HSET', KEYS[5], ARGV[3], ARGV[2] .. ';' .. seq .. ';' .. ARGV[4])
  return {'away', seq, unpack(elsewhere)}
end
local stock = redis.call('HINCRBY', KEYS[1], 'stock', -1)
redis.call('HSET', KEYS[3], ARGV[3], ARGV[2] .. ';' .. seq .. ';' .. ARGV[4] .. ';' .. v[5] .. ';' .. ARGV[6])
if ARGV[5] == 'stream' then
  redis.call('XADD', KEYS[4], '*', 'e', voucher_order_json(ARGV[3], ARGV[1], ARGV[2], seq, ARGV[4], v[5], ARGV[6], ARGV[6]))
end
return {'ok', seq, v[5], stock, ARGV[6]}
