-- ledger_grant_expire: end a credit grant of an ASYNC account at its expires_at. What is left of it leaves the balance
-- as a grant-expiry entry (kind G), recorded for the writer and the reconciler like any entry. Run by the grant-expiry
-- queue's drainer (grants/service.py); the scripts count an expired grant for nothing before this runs (lib/grants).
-- KEYS[1] user:balance:{uid}             hash (ledger_apply)
-- KEYS[2] user:order:{uid}:<id>          string set here (lib/entry): amount;ts;balanceAfter;version;G;epoch;open;;
--                                        grantId;expiresAt;category (the grant, so a take-back can restore it)
-- KEYS[3] user:order:consistency:{uid}   zset: entry ids not yet in the DB, scored by ts
-- KEYS[4] user:grants:{uid}              hash: grant id -> 'remaining;expires_at;category' (lib/grants)
-- KEYS[5] user:grants:expiry:{uid}       zset: grant ids by expires_at
-- KEYS[6] user:held:{uid}                hash: a grant whose credit is not durable yet is not ended
-- KEYS[7] events:{s<n>}                  the event stream (written only when ARGV[5] is 'stream')
-- ARGV[1] grant id  ARGV[2] entry id  ARGV[3] ts, epoch ms  ARGV[4] entry key TTL in seconds
-- ARGV[5] 'stream': XADD the expiry's event to KEYS[7] here (Redis Streams transport); '' with Kafka
-- ARGV[6] the user id (for the streamed event)
-- Returns one of:
--   {'missing'}                             no cached account: load it from the DB, then retry
--   {'sync'}                                the account is SYNC: end the grant in the DB instead
--   {'gone'}                                no such grant (ended already, taken back), or nothing left of it (spent
--                                           whole: tidied here, no entry)
--   {'early'}                               not due yet, its credit not durable yet, or an entry made before
--                                           expires_at still on its way to the DB: try again later
--   {'recovering', until}                   an account rebuilt after a Redis loss whose own records may still be on
--                                           their way to the DB (lib/rebuild_hold): a spend acknowledged before the
--                                           loss may have taken what the rebuilt grant shows; nothing changed, later
--   {'held', until}                         as 'recovering', past hold_until while hold_log is set: this caller
--                                           checks the writer's watermark and, once it is past, loads the account
--   {'ok', id, amount, balance, v, epoch, open}  ended: amount (what was left) left the balance
--! include rebuild_hold
--! include grants
--! include event
local h = redis.call('HMGET', KEYS[1], 'balance', 'v', 'open', 'mode', 'epoch', 'hold_until', 'hold_log')
if not h[1] then return {'missing'} end
if h[4] == 'SYNC' then return {'sync'} end
local held = rebuild_hold(KEYS[1], h[6], h[7], tonumber(ARGV[3]))
if held then return held end
local rec = redis.call('HGET', KEYS[4], ARGV[1])
if not rec then return {'gone'} end
local remaining, expires_at, category = string.match(rec, '^(%d+);(%d+);(.*)$')
if tonumber(expires_at) > tonumber(ARGV[3]) or redis.call('HEXISTS', KEYS[6], ARGV[1]) == 1 then return {'early'} end
-- an entry made before expires_at may have spent of this grant or given back to it; while it is on its way to the DB it
-- may still be taken back, and its part would then land outside the grant (promo credit made plain, or plain money
-- taken for a refund's give-back). Entries made since cannot touch it, so this wait ends once the writer catches up
if redis.call('ZCOUNT', KEYS[3], '-inf', '(' .. expires_at) > 0 then return {'early'} end
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
if tonumber(remaining) == 0 then return {'gone'} end
local balance = redis.call('HINCRBY', KEYS[1], 'balance', -tonumber(remaining))
local open = h[3]
if balance <= 0 and open == '1' then open = 'BALANCE' end
local v = redis.call('HINCRBY', KEYS[1], 'v', 1)
local balance_s, v_s = string.format('%d', balance), string.format('%d', v)
redis.call('HSET', KEYS[1], 'ts', ARGV[3], 'open', open)
local entry = {amount = remaining, ts = ARGV[3], balance_after = balance_s, version = v_s, kind = 'G', epoch = h[5],
  open = open, idem_key = '', grant_id = ARGV[1], ended_expires_at = expires_at, ended_category = category}
redis.call('SET', KEYS[2], entry_string(entry), 'EX', ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
if ARGV[5] == 'stream' then redis.call('XADD', KEYS[7], '*', 'e', ledger_event_json(ARGV[2], ARGV[6], entry)) end
return {'ok', ARGV[2], remaining, balance_s, v_s, h[5], open}
