-- redpacket_load: put a red packet into Redis from the DB, only if Redis does not hold it.
-- All keys share the packet's hash tag.
-- KEYS[1] rp:packet:{rp<id>}     hash: state, expires_at, hold_until, hold_log
-- KEYS[2] rp:unclaimed:{rp<id>}  list of 'item_id;amount' not grabbed yet
-- KEYS[3] rp:grabbers:{rp<id>}   hash: user id -> 'item_id;amount;ts;grab token'
-- ARGV[1] state ('OPEN' | 'EXPIRED' | ...)  ARGV[2] expires_at (epoch ms)
-- ARGV[3] hold_until (epoch ms): grabs answer 'recovering' until then (0 for a new packet)
-- ARGV[4] hold_log: 'await' when grabs wait for the writer to apply the log as it is now (outbox/log_hold.py),
--         '' for no such hold
-- ARGV[5] number of unclaimed items n, then ARGV[6 .. 5+n] 'item_id;amount'
-- ARGV[6+n ..] user id, 'item_id;amount;ts;': pairs of grabs the DB holds
-- Returns 1 when loaded, 0 when the hash already existed.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'expires_at', ARGV[2], 'hold_until', ARGV[3])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'hold_log', ARGV[4]) end
local n = tonumber(ARGV[5])
for i = 6, 5 + n, 2000 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 1999, 5 + n)))
end
for i = 6 + n, #ARGV, 2000 do
  redis.call('HSET', KEYS[3], unpack(ARGV, i, math.min(i + 1999, #ARGV)))
end
return 1
