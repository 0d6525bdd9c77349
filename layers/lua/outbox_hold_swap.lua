-- outbox_hold_swap: move a rebuilt voucher's, red packet's or account's log hold on, only from the value the caller read
-- (compare-and-set: a second loss and rebuild meanwhile starts a hold of its own that this call must not lift).
-- KEYS[1] the entity's hash (voucher:{v<id>}, rp:packet:{rp<id>} or user:balance:{<uid>}), field hold_log:
--         'await' (the rebuild's end of the log not read yet) | '<partition>:<end offset>,...' (read) | absent
-- ARGV[1] the value the caller read  ARGV[2] the new value; '' lifts the hold (hold_log and the time hold go)
-- Returns the value hold_log holds after the call ('' when there is no hold).
local held = redis.call('HGET', KEYS[1], 'hold_log')
if not held then return '' end
if held ~= ARGV[1] then return held end
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], 'hold_log')
  redis.call('HSET', KEYS[1], 'hold_until', 0)
  return ''
end
redis.call('HSET', KEYS[1], 'hold_log', ARGV[2])
return ARGV[2]
