-- voucher_reconcile: make Redis stock + orders pending in Redis + stock sold in the DB = initial stock.
-- Run with the DB voucher row locked (no writer commits meanwhile).
-- KEYS[1] voucher:{v<id>}  KEYS[2] voucher:pending:{v<id>}
-- ARGV[1] stock left in the DB  ARGV[2..] ids of pending orders the DB already holds (settle was lost)
-- Returns {'missing'} when Redis does not hold the voucher, {'same', stock} or {'corrected', old, new}.
local stock = redis.call('HGET', KEYS[1], 'stock')
if not stock then return {'missing'} end
if #ARGV > 1 then redis.call('HDEL', KEYS[2], unpack(ARGV, 2)) end
local expected = tonumber(ARGV[1]) - redis.call('HLEN', KEYS[2])
if tonumber(stock) == expected then return {'same', stock} end
redis.call('HSET', KEYS[1], 'stock', expected)
return {'corrected', stock, expected}
