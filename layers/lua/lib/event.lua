-- lib/event: the JSON of the events the scripts XADD to the stream (Redis Streams transport), one function per event
-- shape of outbox/events.py (LedgerEvent, VoucherOrderEvent, RedPacketClaimEvent; the writer validates each there,
-- tests/integration/test_lua_events.py holds every script's to them). Numbers are spliced as their decimal strings (a
-- 63-bit id never passes through a Lua double, which cjson's numbers are); texts go through cjson.encode.
--! include entry
-- the fields that are texts (names_has), a string of names as lib/entry's lists are (no table built per call)
local EVENT_TEXTS =
  ' kind epoch open idem_key hold_state description refund_of_kind reason grants_spent grant_category grants_refunded '

-- event_json(event_type, fields) -> '{"type":"<event_type>",...}'; fields: {name, value} pairs in order, a nil
-- value is null
local function event_json(event_type, fields)
  local parts = {'{"type":"' .. event_type .. '"'}
  for _, f in ipairs(fields) do
    local name, value = f[1], f[2]
    if value == nil then value = 'null' elseif names_has(EVENT_TEXTS, name) then value = cjson.encode(value) end
    parts[#parts + 1] = '"' .. name .. '":' .. value
  end
  return table.concat(parts, ',') .. '}'
end

-- ledger_event_json(id, user_id, e) -> the LedgerEvent of entry e (entry_fields' table), as ledger/entry.py's
-- Entry.event builds it from the same entry string; an empty idem_key is null
local function ledger_event_json(id, user_id, e)
  local fields = {{'id', id}, {'kind', e.kind}, {'user_id', user_id}, {'amount', e.amount},
    {'balance_after', e.balance_after}, {'version', e.version}, {'epoch', e.epoch}, {'ts', e.ts}, {'open', e.open},
    {'idem_key', e.idem_key ~= '' and e.idem_key or nil}}
  for _, name in ipairs(entry_tail_names(e.kind)) do
    local value = e[name]
    if name ~= '-' and not names_has(ENTRY_ONLY, name) and not (names_has(OPTIONAL, name) and (value or '') == '') then
      fields[#fields + 1] = {name, value}
    end
  end
  return event_json('ledger', fields)
end

-- voucher_order_json(id, voucher_id, user_id, seq, ts, epoch, bucket, home) -> the VoucherOrderEvent
local function voucher_order_json(id, voucher_id, user_id, seq, ts, epoch, bucket, home)
  return event_json('voucher_order', {{'id', id}, {'voucher_id', voucher_id}, {'user_id', user_id}, {'seq', seq},
    {'ts', ts}, {'epoch', epoch}, {'bucket', bucket}, {'home', home}})
end

-- redpacket_claim_json(packet_id, item_id, user_id, amount, ts, grab_id) -> the RedPacketClaimEvent
local function redpacket_claim_json(packet_id, item_id, user_id, amount, ts, grab_id)
  return event_json('redpacket_claim', {{'packet_id', packet_id}, {'item_id', item_id}, {'user_id', user_id},
    {'amount', amount}, {'ts', ts}, {'grab_id', grab_id}})
end
