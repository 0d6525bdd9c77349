-- ledger_reconcile: compare-and-set the cached balance to what the DB plus pending entries say it is.
-- KEYS[1] user:balance:{uid}  hash
-- ARGV[1] v read before the DB check (the CAS guard)  ARGV[2] correct balance  ARGV[3] DB version
-- Returns {'ok', new v}, {'same'} when the cache was already right, or {'changed'} when the hash
-- moved (or vanished) meanwhile: retry on the next run.
local h = redis.call('HMGET', KEYS[1], 'v', 'open', 'balance')
if h[1] ~= ARGV[1] then return {'changed'} end
if h[3] == ARGV[2] and tonumber(h[1]) >= tonumber(ARGV[3]) then
  redis.call('HDEL', KEYS[1], 'dirty')
  return {'same'}
end
local v = math.max(tonumber(h[1]), tonumber(ARGV[3])) + 1
local balance, open = tonumber(ARGV[2]), h[2]
if balance <= 0 and open == '1' then open = 'BALANCE' elseif balance > 0 and open == 'BALANCE' then open = '1' end
redis.call('HSET', KEYS[1], 'balance', ARGV[2], 'v', string.format('%d', v), 'open', open)
redis.call('HDEL', KEYS[1], 'dirty')
return {'ok', string.format('%d', v)}
