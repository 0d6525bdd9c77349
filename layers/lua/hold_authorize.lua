-- hold_authorize: authorize a hold on an ASYNC account held in Redis: what it holds leaves `available` (balance -
-- held credits - active holds) at once, the balance stays until a capture; one ledger entry of kind H.
-- All keys share the {uid} hash tag (one Redis Cluster slot).
-- KEYS[1] user:balance:{uid}           hash: balance, v, threshold, open, mode, epoch, ts, held, on_hold (what the
--                                      ACTIVE holds keep, expired ones included until they are tidied)
-- KEYS[2] user:order:{uid}:<hold id>   the H entry string (the hold's id is its entry's id; keys.entry: the ledger's
--                                      8 fields, then holdId;released;expiresAt;availableAfter;stateAfter;description)
-- KEYS[3] user:order:consistency:{uid} zset: entry ids not yet in the DB, scored by ts
-- KEYS[4] user:holds:{uid}             hash: hold id -> 'amount;captured;state;expiresAt;createdAt;description'
-- KEYS[5] user:holds:expiry:{uid}      zset: ACTIVE hold ids by expires_at
-- KEYS[6] events:{s<n>}                the event stream (written only when ARGV[6] is 'stream')
-- ARGV[1] amount in minor units (> 0)  ARGV[2] ts, epoch ms  ARGV[3] hold id (decimal string)
-- ARGV[4] expires_at, epoch ms (> ts)  ARGV[5] entry key TTL in seconds  ARGV[6] 'stream' | ''
-- ARGV[7] user id  ARGV[8] description (any text)  ARGV[9] most pending entries ('' or '0': no bound)
-- Returns one of:
--   {'missing'}                       no cached account: load it, then retry
--   {'sync'}                          a SYNC account: authorize in the DB instead
--   {'closed', balance, v}            the account's API is closed
--   {'insufficient', balance, v}      available - amount would fall below the threshold
--   {'too_many_pending'}              the account's entries are not reaching the DB: nothing changed
--   {'ok', balance, v, epoch, open, available}  authorized; also when KEYS[2] exists (a resend after a lost reply:
--                                     answered as it was, nothing held twice)
local amount, ts, hold_id = tonumber(ARGV[1]), ARGV[2], ARGV[3]

local function fields_of(s)
  local f = {}
  for part in string.gmatch(s .. ';', '([^;]*);') do f[#f + 1] = part end
  if f[1] == 'settled' then table.remove(f, 1) end
  return f
end

local applied = redis.call('GET', KEYS[2])
if applied then
  local f = fields_of(applied)
  return {'ok', f[3], f[4], f[6], f[7], f[12]}
end

local h = redis.call('HMGET', KEYS[1], 'balance', 'v', 'threshold', 'open', 'mode', 'epoch', 'held', 'on_hold')
if not h[1] then return {'missing'} end
if h[5] == 'SYNC' then return {'sync'} end
if h[4] ~= '1' then return {'closed', h[1], h[2]} end

-- what the ACTIVE holds keep, less those past expires_at: an expired hold never counts, tidied or not
local on_hold = tonumber(h[8]) or 0
local live = on_hold
if on_hold > 0 then
  local expired = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', ts)
  if #expired > 0 then
    for _, rec in ipairs(redis.call('HMGET', KEYS[4], unpack(expired))) do
      if rec then
        local a, c = string.match(rec, '^(%d+);(%d+);')
        live = live - (tonumber(a) - tonumber(c))
      end
    end
  end
end
local balance = tonumber(h[1])
if balance - (tonumber(h[7]) or 0) - live - amount < tonumber(h[3]) then return {'insufficient', h[1], h[2]} end
local max_pending = tonumber(ARGV[9] or '') or 0
if max_pending > 0 and redis.call('ZCARD', KEYS[3]) >= max_pending then return {'too_many_pending'} end

on_hold = redis.call('HINCRBY', KEYS[1], 'on_hold', amount)
local v = redis.call('HINCRBY', KEYS[1], 'v', 1)
redis.call('HSET', KEYS[1], 'ts', ts)
local available = balance - (tonumber(h[7]) or 0) - (live + amount)
local v_s, available_s = string.format('%d', v), string.format('%d', available)
redis.call('HSET', KEYS[4], hold_id, table.concat({ARGV[1], '0', 'ACTIVE', ARGV[4], ts, ARGV[8]}, ';'))
redis.call('ZADD', KEYS[5], ARGV[4], hold_id)
redis.call('SET', KEYS[2], table.concat({ARGV[1], ts, h[1], v_s, 'H', h[6], h[4], '', hold_id, '0', ARGV[4], available_s,
  'ACTIVE', ARGV[8]}, ';'), 'EX', ARGV[5])
redis.call('ZADD', KEYS[3], ts, hold_id)
if ARGV[6] == 'stream' then
  redis.call('XADD', KEYS[6], '*', 'e', '{"type":"ledger","id":' .. hold_id .. ',"kind":"H","user_id":' .. ARGV[7]
    .. ',"amount":' .. ARGV[1] .. ',"balance_after":' .. h[1] .. ',"version":' .. v_s .. ',"epoch":"' .. h[6]
    .. '","ts":' .. ts .. ',"open":"' .. h[4] .. '","idem_key":null,"hold_id":' .. hold_id .. ',"released":0'
    .. ',"expires_at":' .. ARGV[4] .. ',"available_after":' .. available_s .. ',"hold_state":"ACTIVE","description":'
    .. cjson.encode(ARGV[8]) .. '}')
end
return {'ok', h[1], v_s, h[6], h[4], available_s}
