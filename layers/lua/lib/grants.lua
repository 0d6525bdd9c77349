-- lib/grants: an account's credit grants (issue 34), shared by the scripts that credit, spend or end them
-- (ledger_apply: a recharge's grant, a deduct's spend, a transfer's reach; hold_change: a capture's spend; ledger_refund: a refund's
-- give-back; ledger_grant_expire; ledger_load). Included where a script
-- says `--! include grants` (dal/redis_store.script_text). The keys the includer passes, all of the account's slot:
--   grants  user:grants:{uid}         hash: grant id (its recharge's entry id) -> 'remaining;expires_at;category'
--                                     (a grant spent whole stays, remaining 0, until its expiry tidies it)
--   expiry  user:grants:expiry:{uid}  zset: grant ids by expires_at
--   held    user:held:{uid}           hash (ledger_apply): a grant whose credit is not durable yet is not spent
--   account user:balance:{uid}        hash: its `grants` field is '1' once a grant went in the expiry zset (grant_add,
--                                     its only writer: never cleared, so '1' may outlive the last grant, costing that
--                                     account the grants' lookups), '0' when loaded without grants; a debit of an
--                                     account without grants reads it with the account instead of an EXISTS
-- Expiry is judged by the caller's clock `now` (the script's ts), like a hold's: a grant at or past expires_at counts
-- for nothing, whether or not its expiry entry is booked yet.

-- grant_record(remaining, expires_at, category) -> the hash value
local function grant_record(remaining, expires_at, category)
  return string.format('%d', remaining) .. ';' .. expires_at .. ';' .. category
end

-- grants_expired(grants, expiry, now) -> what the grants past expires_at still hold (left out of available)
local function grants_expired(grants, expiry, now)
  local ids = redis.call('ZRANGEBYSCORE', expiry, '-inf', now)
  local total = 0
  if #ids == 0 then return 0 end
  for _, rec in ipairs(redis.call('HMGET', grants, unpack(ids))) do
    if rec then total = total + tonumber(string.match(rec, '^(%d+);')) end
  end
  return total
end

-- grants_live(grants, expiry, held, now) -> what the live grants have left whose credit is durable: out of a plain-only
-- debit's reach (ledger_apply: a transfer's). A grant whose credit is held is out of reach already (the balance's held)
local function grants_live(grants, expiry, held, now)
  local live, total = redis.call('ZRANGEBYSCORE', expiry, '(' .. now, '+inf'), 0
  for i, rec in ipairs(#live > 0 and redis.call('HMGET', grants, unpack(live)) or {}) do
    if rec and redis.call('HEXISTS', held, live[i]) == 0 then total = total + tonumber(string.match(rec, '^(%d+);')) end
  end
  return total
end

-- grants_spend(grants, expiry, held, now, amount) -> '<grant id>:<spent>,...' taken from the live grants
-- first-to-expire ('' when none); what is left of amount comes from the plain balance
local function grants_spend(grants, expiry, held, now, amount)
  local spent = {}
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', expiry, '(' .. now, '+inf')) do
    if amount <= 0 then break end
    if redis.call('HEXISTS', held, id) == 0 then
      local remaining, expires_at, category = string.match(redis.call('HGET', grants, id), '^(%d+);(%d+);(.*)$')
      local take = math.min(tonumber(remaining), amount)
      if take > 0 then
        amount = amount - take
        redis.call('HSET', grants, id, grant_record(tonumber(remaining) - take, expires_at, category))
        spent[#spent + 1] = id .. ':' .. string.format('%d', take)
      end
    end
  end
  return table.concat(spent, ',')
end

-- grant_add(account, grants, expiry, id, amount, expires_at, category): a recharge's grant (the account is cached)
local function grant_add(account, grants, expiry, id, amount, expires_at, category)
  redis.call('HSET', grants, id, grant_record(amount, expires_at, category))
  redis.call('ZADD', expiry, expires_at, id)
  redis.call('HSET', account, 'grants', '1')
end

-- grants_looked_up(account, expiry) -> whether an account cached before its `grants` field existed may have grants:
-- it looks once and keeps the answer. Callers read the field themselves and call this only when it is absent
-- (`flag == '1' or (not flag and grants_looked_up(...))`): on a hot deduct a Lua call costs about what the EXISTS did
local function grants_looked_up(account, expiry)
  local has = redis.call('EXISTS', expiry) == 1
  redis.call('HSET', account, 'grants', has and '1' or '0')
  return has
end

-- grants_give_back(grants, spent, sign): a deduct or capture taken back returns each grant's part to it ('<grant
-- id>:<spent>,...'); a grant that ended meanwhile keeps it in the plain balance (its expiry took only what was left of
-- it then). sign -1: a refund taken back takes what it gave its grants, never below 0 (spent meanwhile: the balance
-- is right, the split bounded)
local function grants_give_back(grants, spent, sign)
  for id, amount in string.gmatch(spent, '(%d+):(%d+)') do
    local rec = redis.call('HGET', grants, id)
    if rec then
      local remaining, expires_at, category = string.match(rec, '^(%d+);(%d+);(.*)$')
      local after = math.max(tonumber(remaining) + (sign or 1) * tonumber(amount), 0)
      redis.call('HSET', grants, id, grant_record(after, expires_at, category))
    end
  end
end

-- grant_remove(grants, expiry, id): a granted recharge taken back takes its grant with it
local function grant_remove(grants, expiry, id)
  redis.call('HDEL', grants, id)
  redis.call('ZREM', expiry, id)
end

-- grants_refund(grants, spent, charged, refunded_before, amount, now) -> '<grant id>:<part>,...' given back: a refund
-- undoes its charge from the end, first what it took of the plain balance, then its grants last-spent first (spent:
-- the charge's '<grant id>:<spent>,...' in spend order), so each refund's parts follow from the charge's refunded
-- total before it alone (grants/rows.py refund_parts). A part goes back to its grant only while the grant is live:
-- an expired (or ended) grant is never revived, its part stays in the plain balance
local function grants_refund(grants, spent, charged, refunded_before, amount, now)
  local ids, parts, plain = {}, {}, charged
  for id, part in string.gmatch(spent, '(%d+):(%d+)') do
    ids[#ids + 1], parts[#parts + 1] = id, tonumber(part)
    plain = plain - tonumber(part)
  end
  local skip = math.max(refunded_before - plain, 0)
  local left = amount - math.min(math.max(plain - refunded_before, 0), amount)
  local back = {}
  for i = #ids, 1, -1 do
    if left <= 0 then break end
    local from_skip = math.min(skip, parts[i])
    skip = skip - from_skip
    local take = math.min(parts[i] - from_skip, left)
    if take > 0 then
      left = left - take
      local rec = redis.call('HGET', grants, ids[i])
      if rec then
        local remaining, expires_at, category = string.match(rec, '^(%d+);(%d+);(.*)$')
        if tonumber(expires_at) > tonumber(now) then
          redis.call('HSET', grants, ids[i], grant_record(tonumber(remaining) + take, expires_at, category))
          back[#back + 1] = ids[i] .. ':' .. string.format('%d', take)
        end
      end
    end
  end
  return table.concat(back, ',')
end

