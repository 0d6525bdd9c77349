-- lib/entry: the entry string of a ledger change, user:order:{uid}:<id>, encoded and decoded here only (the reconciler
-- reads it too: ledger/entry.py Entry.parse). The ledger's eight fields amount;ts;balanceAfter;version;kind;epoch;
-- open;idemKey, then the fields of its kind (ENTRY_TAILS); ledger_settle keeps a persisted one as 'settled;<entry>'.
-- Every value is a string (numbers as their decimal strings: a 63-bit id never passes through a Lua double).
-- entry_fields(s) -> a table of the fields by name (the last field of a kind, a text, may hold ';')
-- entry_string(e) -> the string of such a table (a field it lacks is written ''), and its tail (entry_tail)
-- A script's top level runs again at every call (EVALSHA): each table here is built and collected on every call of
-- the hot path, so the lists below are two tables and strings of names, split with plain finds (a Lua pattern, a C
-- call per loop step cost more; docs/performance.md has what each part of a deduct costs).
local ENTRY_HEAD = {'amount', 'ts', 'balance_after', 'version', 'kind', 'epoch', 'open', 'idem_key'}
-- the fields after the head by kind, separated by spaces, in the ledger event's order too (lib/event); '-' is a field
-- always '' (the description's place in a hold change other than an authorize). Credit grants: what a deduct or a
-- capture spent ('<grant id>:<spent>,...', first-to-expire), a granted recharge's grant (its id is the entry's), what a
-- refund gave back to which grant ('<grant id>:<part>,...'), the grant an expiry ends with what a take-back needs to
-- restore it (ENTRY_ONLY); a transfer's debit (T) spends no grant: no field
local ENTRY_TAILS = {
  D = 'grants_spent', T = '',
  R = 'grant_expires_at grant_category',
  G = 'grant_id ended_expires_at ended_category',
  A = '', N = 'grants_spent',
  F = 'refund_of refund_of_kind refunded_after grants_refunded reason',
  H = 'hold_id released expires_at available_after hold_state description',
  C = 'hold_id released expires_at available_after hold_state - captured_after grants_spent',
  V = 'hold_id released expires_at available_after hold_state - captured_after',
  X = 'hold_id released expires_at available_after hold_state - captured_after',
}

-- fields an entry may lack: left off its string's end when '' (a deduct or recharge without a grant is the eight
-- fields alone), and off its event
local OPTIONAL = ' grants_spent grant_expires_at grant_category grants_refunded '
-- fields the entry keeps and its event does not carry
local ENTRY_ONLY = ' ended_expires_at ended_category '

-- names_has(names, name) -> whether a string of names separated by spaces (OPTIONAL, ...) holds name
local function names_has(names, name)
  return string.find(names, ' ' .. name .. ' ', 1, true) ~= nil
end

-- entry_tail_names(kind) -> the names of its fields after the head, a list (an error for no kind of ENTRY_TAILS)
local function entry_tail_names(kind)
  local names, from, s = {}, 1, ENTRY_TAILS[kind]
  while from <= #s do
    local space = string.find(s, ' ', from, true) or #s + 1
    names[#names + 1] = string.sub(s, from, space - 1)
    from = space + 1
  end
  return names
end

local function entry_fields(s)
  local parts = {}
  for part in string.gmatch(s .. ';', '([^;]*);') do parts[#parts + 1] = part end
  if parts[1] == 'settled' then table.remove(parts, 1) end
  local e, names = {}, entry_tail_names(parts[5])
  for i, name in ipairs(ENTRY_HEAD) do e[name] = parts[i] end
  for i, name in ipairs(names) do e[name] = parts[#ENTRY_HEAD + i] end
  local count = #ENTRY_HEAD + #names
  if #parts > count then  -- the last field is a text with ';' in it
    e[names[#names] or ENTRY_HEAD[#ENTRY_HEAD]] = table.concat(parts, ';', count)
  end
  return e
end

-- entry_string(e) -> the string, and the fields of its kind as it ends with them (its trailing '' OPTIONAL ones left
-- off; '' for none: ledger/entry.py's Entry.grant)
local function entry_string(e)
  local fields, kept, names = {}, 0, entry_tail_names(e.kind)
  for i = 1, #names do
    fields[i] = e[names[i]] or ''
    if fields[i] ~= '' or not names_has(OPTIONAL, names[i]) then kept = i end
  end
  -- the head in ENTRY_HEAD's order (test_lua_library holds it to it), one concatenation: a loop and table.concat cost
  -- twice as much, on every call
  local s = (e.amount or '') .. ';' .. (e.ts or '') .. ';' .. (e.balance_after or '') .. ';' .. (e.version or '')
    .. ';' .. (e.kind or '') .. ';' .. (e.epoch or '') .. ';' .. (e.open or '') .. ';' .. (e.idem_key or '')
  if kept == 0 then return s, '' end
  local tail = table.concat(fields, ';', 1, kept)
  return s .. ';' .. tail, tail
end

-- entry_tail(e) -> the fields of its kind as its string ends with them (entry_string's second value)
local function entry_tail(e)
  local _, tail = entry_string(e)
  return tail
end
