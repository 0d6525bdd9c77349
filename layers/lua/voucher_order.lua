-- voucher_order: take one unit of a flash-sale voucher for a buyer, atomically.
-- All keys share the voucher's hash tag (the seed built keys inside Lua, which Redis Cluster forbids).
-- KEYS[1] voucher:{v<id>}          hash: stock, begin, end, limit, epoch, hold_until, db_version
-- KEYS[2] voucher:buyers:{v<id>}   hash: user id -> orders taken; '<user id>:settled' -> ',order;seq;epoch...' of the
--                                  buyer's persisted orders (voucher_settle: resend evidence)
-- KEYS[3] voucher:pending:{v<id>}  hash: order id -> 'user;seq;ts;epoch' until the writer persisted it
-- KEYS[4] events:{s<n>}            event stream (written only when ARGV[5] is 'stream')
-- ARGV[1] voucher id  ARGV[2] user id  ARGV[3] order id (decimal string)  ARGV[4] now (epoch ms)
-- ARGV[5] 'stream' to XADD the order event here (Redis Streams transport), '' for Kafka
-- Returns one of:
--   {'missing'}              Redis does not hold the voucher: load it from the DB, then retry
--   {'not_started', begin}   {'ended', end}
--   {'recovering', until}    rebuilt after Redis lost it: orders wait until then
--   {'sold_out'}             stock <= 0
--   {'already', taken}       the buyer holds the per-user limit already
--   {'ok', seq, epoch, stock_left}  taken: seq is the buyer's n-th order of this voucher. Also the
--                            answer to a resent call whose order id is pending already, or persisted (nothing
--                            taken twice)
local pending = redis.call('HGET', KEYS[3], ARGV[3])
if pending then
  local f = {}
  for part in string.gmatch(pending, '[^;]+') do f[#f + 1] = part end
  return {'ok', f[2], f[4], redis.call('HGET', KEYS[1], 'stock')}
end
-- a resend arriving after the writer persisted and settled the order: voucher_settle left it with the buyer
local settled = redis.call('HGET', KEYS[2], ARGV[2] .. ':settled')
if settled then
  local seq, epoch = string.match(settled, ',' .. ARGV[3] .. ';(%d+);([^,]*)')
  if seq then return {'ok', seq, epoch, redis.call('HGET', KEYS[1], 'stock')} end
end
local v = redis.call('HMGET', KEYS[1], 'stock', 'begin', 'end', 'limit', 'epoch', 'hold_until')
if not v[1] then return {'missing'} end
local now = tonumber(ARGV[4])
if now < tonumber(v[2]) then return {'not_started', v[2]} end
if now >= tonumber(v[3]) then return {'ended', v[3]} end
if now < tonumber(v[6]) then return {'recovering', v[6]} end  -- only a sale still on needs orders in flight to land
if tonumber(v[1]) <= 0 then return {'sold_out'} end
local taken = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
if taken >= tonumber(v[4]) then return {'already', taken} end
local stock = redis.call('HINCRBY', KEYS[1], 'stock', -1)
local seq = redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
redis.call('HSET', KEYS[3], ARGV[3], ARGV[2] .. ';' .. seq .. ';' .. ARGV[4] .. ';' .. v[5])
if ARGV[5] == 'stream' then
  redis.call('XADD', KEYS[4], '*', 'e', '{"type":"voucher_order","id":' .. ARGV[3] .. ',"voucher_id":' .. ARGV[1]
    .. ',"user_id":' .. ARGV[2] .. ',"seq":' .. seq .. ',"ts":' .. ARGV[4] .. ',"epoch":"' .. v[5] .. '"}')
end
return {'ok', seq, v[5], stock}
