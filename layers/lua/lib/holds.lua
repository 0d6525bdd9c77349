-- lib/holds: an account's holds as Redis keeps them, user:holds:{uid}: hold id ->
-- 'amount;captured;state;expiresAt;createdAt;description' (the description last, and free to hold ';'), and what the
-- live ones keep out of `available`. Included by every script that reads a hold or spends from available.
-- hold_fields(rec) -> the record's fields as a list; hold_string(r) -> the record of such a list
local function hold_fields(rec)
  local r = {}
  for part in string.gmatch(rec .. ';', '([^;]*);') do r[#r + 1] = part end
  return r
end

local function hold_string(r)
  return table.concat(r, ';')
end

-- live_holds(on_hold, holds_key, expiry_key, now) -> what the ACTIVE holds keep (on_hold, the account hash's field)
-- less what those past expires_at keep: an expired hold never counts, tidied or not. Only accounts with holds pay for
-- the lookup.
local function live_holds(on_hold, holds_key, expiry_key, now)
  if on_hold <= 0 then return 0 end
  local expired = redis.call('ZRANGEBYSCORE', expiry_key, '-inf', now)
  if #expired > 0 then
    for _, rec in ipairs(redis.call('HMGET', holds_key, unpack(expired))) do
      if rec then
        local r = hold_fields(rec)
        on_hold = on_hold - (tonumber(r[1]) - tonumber(r[2]))
      end
    end
  end
  return on_hold
end
