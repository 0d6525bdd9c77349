-- delay_take: move due elements, atomically, from the waiting set to the taken set with a visibility
-- deadline. A consumer that dies before acknowledging (ZREM from the taken set) loses nothing: once the
-- deadline passes, the element is taken again (at-least-once delivery to an idempotent handler).
-- KEYS[1] dq:due:{<queue>}    zset: element -> due (epoch ms)
-- KEYS[2] dq:taken:{<queue>}  zset: element -> visibility deadline (epoch ms)
-- ARGV[1] now (epoch ms)  ARGV[2] most elements to take  ARGV[3] visibility timeout (ms)
-- Returns {elements taken (flat list: element, due, element, due ...), earliest due left or -1,
--          earliest visibility deadline or -1}. Redelivered elements come first, with due = their deadline.
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local deadline = now + tonumber(ARGV[3])
local out = {}

-- into the taken set with the new deadline (one ZADD per 1000 members); returns the members
local function take(found)
  local members, args = {}, {}
  for i = 1, #found, 2 do
    members[#members + 1] = found[i]
    args[#args + 1] = deadline
    args[#args + 1] = found[i]
    out[#out + 1] = found[i]
    out[#out + 1] = found[i + 1]
  end
  for i = 1, #args, 2000 do redis.call('ZADD', KEYS[2], unpack(args, i, math.min(i + 1999, #args))) end
  return members
end

take(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit))
local room = limit - #out / 2
if room > 0 then
  local due = take(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, room))
  for i = 1, #due, 1000 do redis.call('ZREM', KEYS[1], unpack(due, i, math.min(i + 999, #due))) end
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local taken_head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {out, head[2] or '-1', taken_head[2] or '-1'}
