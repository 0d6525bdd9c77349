-- lib/entry: the entry string of a ledger change, user:order:{uid}:<id>, encoded and decoded here only (the reconciler
-- reads it too: ledger/entry.py Entry.parse). The ledger's eight fields amount;ts;balanceAfter;version;kind;epoch;
-- open;idemKey, then the fields of its kind (ENTRY_TAILS); ledger_settle keeps a persisted one as 'settled;<entry>'.
-- Every value is a string (numbers as their decimal strings: a 63-bit id never passes through a Lua double).
-- entry_fields(s) -> a table of the fields by name (the last field of a kind, a text, may hold ';')
-- entry_string(e) -> the string of such a table (a field it lacks is written '')
local ENTRY_HEAD = {'amount', 'ts', 'balance_after', 'version', 'kind', 'epoch', 'open', 'idem_key'}
-- the fields after the head by kind, in the ledger event's order too (lib/event); '-' is a field always '' (the
-- description's place in a hold change other than an authorize)
local HOLD_CHANGE = {'hold_id', 'released', 'expires_at', 'available_after', 'hold_state'}
local function hold_change_tail(last)
  local tail = {unpack(HOLD_CHANGE)}
  for _, name in ipairs(last) do tail[#tail + 1] = name end
  return tail
end
-- credit grants: what a deduct or a capture spent ('<grant id>:<spent>,...', first-to-expire), a granted recharge's
-- grant (its id is the entry's), what a refund gave back to which grant ('<grant id>:<part>,...'), the grant an expiry
-- ends with what a take-back needs to restore it (ENTRY_ONLY)
local ENTRY_TAILS = {
  D = {'grants_spent'},
  R = {'grant_expires_at', 'grant_category'},
  G = {'grant_id', 'ended_expires_at', 'ended_category'},
  A = {}, N = {'grants_spent'},
  F = {'refund_of', 'refund_of_kind', 'refunded_after', 'grants_refunded', 'reason'},
  H = hold_change_tail({'description'}),
  C = hold_change_tail({'-', 'captured_after', 'grants_spent'}),
  V = hold_change_tail({'-', 'captured_after'}),
  X = hold_change_tail({'-', 'captured_after'}),
}

-- fields an entry may lack: left off its string's end when '' (a deduct or recharge without a grant is the eight
-- fields alone), and off its event
local OPTIONAL = {grants_spent = true, grant_expires_at = true, grant_category = true, grants_refunded = true}
-- fields the entry keeps and its event does not carry
local ENTRY_ONLY = {ended_expires_at = true, ended_category = true}

local function entry_names(kind)
  local names = {unpack(ENTRY_HEAD)}
  for _, name in ipairs(ENTRY_TAILS[kind]) do names[#names + 1] = name end
  return names
end

local function entry_fields(s)
  local parts = {}
  for part in string.gmatch(s .. ';', '([^;]*);') do parts[#parts + 1] = part end
  if parts[1] == 'settled' then table.remove(parts, 1) end
  local names, e = entry_names(parts[5]), {}
  for i, name in ipairs(names) do e[name] = parts[i] end
  if #parts > #names then  -- the last field is a text with ';' in it
    e[names[#names]] = table.concat(parts, ';', #names)
  end
  return e
end

local function entry_string(e)
  local parts = {}
  local names = entry_names(e.kind)
  for i, name in ipairs(names) do parts[i] = e[name] or '' end
  while #parts > #ENTRY_HEAD and parts[#parts] == '' and OPTIONAL[names[#parts]] do parts[#parts] = nil end
  return table.concat(parts, ';')
end

-- entry_tail(e) -> the fields of its kind as its string ends with them ('' for none: ledger/entry.py's Entry.grant)
local function entry_tail(e)
  return string.match(entry_string(e), '^' .. string.rep('[^;]*;', #ENTRY_HEAD) .. '(.*)$') or ''
end
