-- redpacket_grab: one user grabs one packet, atomically (the seed's script, with every key in KEYS,
-- an expiry check and a resend-safe answer).
-- KEYS[1] rp:packet:{rp<id>}     hash: state, expires_at, hold_until, hold_log
-- KEYS[2] rp:unclaimed:{rp<id>}  list of 'item_id;amount'
-- KEYS[3] rp:grabbers:{rp<id>}   hash: user id -> 'item_id;amount;ts;grab token'
-- KEYS[4] rp:pending:{rp<id>}    hash: item id -> 'user;amount;ts;grab token' until the writer persisted the claim
-- KEYS[5] events:{s<n>}          event stream (written only when ARGV[5] is 'stream')
-- ARGV[1] packet id  ARGV[2] user id  ARGV[3] now (epoch ms)
-- ARGV[4] grab token (an integer id): unique per request, so a resent call is recognised as itself; the
--         claim event carries it as grab_id, which names the grab's fate key
-- ARGV[5] 'stream' to XADD the claim event here (Redis Streams transport), '' for Kafka
-- Returns one of:
--   {'missing'}                      Redis does not hold the packet: load it from the DB, then retry
--   {'not_open', state}              CREATING (the sender's debit is not settled) or FAILED
--   {'expired'}                      past expires_at, or EXPIRED / REFUNDING / REFUNDED
--   {'recovering', until}            rebuilt after Redis lost it: grabs wait until then
--   {'held', until}                  rebuilt, and waiting for the writer to apply the log (hold_log): this caller
--                                    checks (outbox/log_hold.py) and lifts it or answers RECOVERING
--   {'already', item_id, amount}     this user grabbed from this packet before
--   {'empty'}                        nothing left
--   {'ok', item_id, amount}          grabbed (also the answer to a resent call of the same grab)
--! include event
local p = redis.call('HMGET', KEYS[1], 'state', 'expires_at', 'hold_until', 'hold_log')
if not p[1] then return {'missing'} end
local seen = redis.call('HGET', KEYS[3], ARGV[2])
if seen then
  local f = {}
  for part in string.gmatch(seen, '[^;]+') do f[#f + 1] = part end
  if f[4] == ARGV[4] then return {'ok', f[1], f[2]} end
  return {'already', f[1], f[2]}
end
local now = tonumber(ARGV[3])
if p[1] == 'CREATING' or p[1] == 'FAILED' then return {'not_open', p[1]} end
if p[1] ~= 'OPEN' or now >= tonumber(p[2]) then return {'expired'} end
if now < tonumber(p[3]) then return {'recovering', p[3]} end  -- only an open packet needs claims in flight to land
if p[4] then  -- one caller a second checks the writer's watermark
  redis.call('HSET', KEYS[1], 'hold_until', now + 1000)
  return {'held', now + 1000}
end
local item = redis.call('LPOP', KEYS[2])
if not item then return {'empty'} end
local sep = string.find(item, ';', 1, true)
local item_id, amount = string.sub(item, 1, sep - 1), string.sub(item, sep + 1)
redis.call('HSET', KEYS[3], ARGV[2], item .. ';' .. ARGV[3] .. ';' .. ARGV[4])
redis.call('HSET', KEYS[4], item_id, ARGV[2] .. ';' .. amount .. ';' .. ARGV[3] .. ';' .. ARGV[4])
if ARGV[5] == 'stream' then
  redis.call('XADD', KEYS[5], '*', 'e', redpacket_claim_json(ARGV[1], item_id, ARGV[2], amount, ARGV[3], ARGV[4]))
end
return {'ok', item_id, amount}
