-- voucher_take: take one unit from a stock bucket other than the buyer's home, for an order whose buyer slot
-- voucher_order reserved in the home bucket ('away'). All keys share this bucket's hash tag.
-- KEYS[1] voucher:{v<id>:b<k>}          hash: stock, epoch, hold_until, hold_log, ... (voucher_order.lua)
-- KEYS[2] voucher:buyers:{v<id>:b<k>}   '<user id>:settled' -> ',order;seq;epoch;bucket...' (voucher_settle: resend
--                                       evidence of orders whose unit came from here)
-- KEYS[3] voucher:pending:{v<id>:b<k>}  hash: order id -> 'user;seq;ts;epoch;home' until the writer persisted it
-- KEYS[4] events:{s<n>}                 event stream (written only when ARGV[5] is 'stream')
-- ARGV[1] voucher id  ARGV[2] user id  ARGV[3] order id  ARGV[4] now (epoch ms)  ARGV[5] 'stream' or ''
-- ARGV[6] the buyer's slot (seq) reserved at home  ARGV[7] the home bucket  ARGV[8] this bucket
-- Returns one of:
--   {'missing'}              Redis does not hold this bucket
--   {'recovering', until}    {'held', until}   as voucher_order (this bucket was rebuilt and waits)
--   {'sold_out'}             stock <= 0 here
--   {'ok', epoch}            taken here; also the answer to a resent call whose order is pending or persisted
--! include event
local pending = redis.call('HGET', KEYS[3], ARGV[3])
if pending then return {'ok', string.match(pending, '^[^;]*;[^;]*;[^;]*;([^;]*)')} end
local settled = redis.call('HGET', KEYS[2], ARGV[2] .. ':settled')
if settled then
  local epoch = string.match(settled, ',' .. ARGV[3] .. ';%d+;([^;,]*)')
  if epoch then return {'ok', epoch} end
end
local v = redis.call('HMGET', KEYS[1], 'stock', 'epoch', 'hold_until', 'hold_log')
if not v[1] then return {'missing'} end
local now = tonumber(ARGV[4])
if now < tonumber(v[3]) then return {'recovering', v[3]} end
if v[4] then
  redis.call('HSET', KEYS[1], 'hold_until', now + 1000)
  return {'held', now + 1000}
end
if tonumber(v[1]) <= 0 then return {'sold_out'} end
redis.call('HINCRBY', KEYS[1], 'stock', -1)
redis.call('HSET', KEYS[3], ARGV[3], ARGV[2] .. ';' .. ARGV[6] .. ';' .. ARGV[4] .. ';' .. v[2] .. ';' .. ARGV[7])
if ARGV[5] == 'stream' then
  redis.call('XADD', KEYS[4], '*', 'e', voucher_order_json(ARGV[3], ARGV[1], ARGV[2], ARGV[6], ARGV[4], v[2], ARGV[8], ARGV[7]))
end
return {'ok', v[2]}
