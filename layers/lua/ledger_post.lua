-- ledger_post: an entry's event is durable (the broker acknowledged it): release what waited for it. A credit's hold
-- (its amount can be spent now), or a hold capture's inflight count (the hold may end now).
-- KEYS[1] user:balance:{uid}  hash (held: the credits not durable yet)
-- KEYS[2] user:held:{uid}     hash: entry id -> amount of each held credit (ledger_apply), 'h<hold id>' of a
--                             capture not durable yet or 'a<hold id>' of an authorize not durable yet (hold_change)
-- KEYS[3] user:holds:{uid}    hash: '<hold id>:inflight' -> captures of the hold not durable yet; '<hold id>:authorizing'
--                             while its authorize is not (no change of the hold before)
-- ARGV[1] entry id
-- Returns 1 when something was released, 0 when nothing waited (posted already, settled by the writer, rolled back,
-- or lost with the account).
local waiting = redis.call('HGET', KEYS[2], ARGV[1])
if not waiting then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
if string.sub(waiting, 1, 1) == 'h' then
  local field = string.sub(waiting, 2) .. ':inflight'
  if redis.call('HINCRBY', KEYS[3], field, -1) <= 0 then redis.call('HDEL', KEYS[3], field) end
  return 1
end
if string.sub(waiting, 1, 1) == 'a' then
  redis.call('HDEL', KEYS[3], string.sub(waiting, 2) .. ':authorizing')
  return 1
end
if redis.call('HINCRBY', KEYS[1], 'held', -tonumber(waiting)) <= 0 then redis.call('HDEL', KEYS[1], 'held') end
return 1
