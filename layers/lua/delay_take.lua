-- delay_take: move due elements, atomically, from the waiting set to the taken set with a visibility
-- deadline, each delivery with its own receipt (like an SQS receipt handle). A consumer that dies before
-- acknowledging loses nothing: once the deadline passes, the element is taken again (at-least-once delivery to
-- an idempotent handler) with a new receipt, and only the newest receipt acknowledges or extends it.
-- An element whose lease ran out after max_deliveries deliveries (its consumer keeps dying on it) is not handed
-- out again: it moves to the dead letters (SQS's maxReceiveCount and redrive policy).
-- KEYS[1] dq:due:{<queue>}         zset: element -> due (epoch ms)
-- KEYS[2] dq:taken:{<queue>}       zset: element -> visibility deadline (epoch ms)
-- KEYS[3] dq:receipt:{<queue>}     hash: taken element -> its current delivery's sequence number
-- KEYS[4] dq:deliveries:{<queue>}  hash: element -> deliveries so far (kept while taken or dead)
-- KEYS[5] dq:seq:{<queue>}         the last delivery sequence handed out; each take starts past the larger of it and
--                                  Redis' clock (1000 per ms), so a receipt from before a Redis loss, or from a
--                                  take a promoted replica never saw, never matches a delivery after it
-- KEYS[6] dq:dead:{<queue>}        zset: dead letter -> when it died (epoch ms)
-- ARGV[1] now (epoch ms)  ARGV[2] most elements to take  ARGV[3] visibility timeout (ms)
-- ARGV[4] max deliveries (0: no limit)
-- Returns {elements taken (flat: element, due, sequence, deliveries, ...), earliest due left or -1,
--          earliest visibility deadline or -1, elements moved to the dead letters now}.
-- Redelivered elements come first, with due = their old deadline.
local now, limit, max = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
local deadline = now + tonumber(ARGV[3])
local out, dead = {}, 0

local function next_seq(n)
  local t = redis.call('TIME')
  local base = math.max(tonumber(redis.call('GET', KEYS[5]) or '0'),
                        tonumber(t[1]) * 1000000 + math.floor(tonumber(t[2]) / 1000) * 1000)
  redis.call('SET', KEYS[5], string.format('%d', base + n))
  return base
end

-- into the taken set with the new deadline, a new receipt each; returns the members taken
local function take(found, redelivered)
  local members = {}
  for i = 1, #found, 2 do
    local element = found[i]
    local count = tonumber(redis.call('HGET', KEYS[4], element) or '0')
    if redelivered and max > 0 and count >= max then
      redis.call('ZREM', KEYS[2], element)
      redis.call('HDEL', KEYS[3], element)
      redis.call('ZADD', KEYS[6], now, element)
      dead = dead + 1
    else
      members[#members + 1] = element
      out[#out + 1] = element
      out[#out + 1] = found[i + 1]
      out[#out + 1] = 0  -- the sequence, below
      out[#out + 1] = redis.call('HINCRBY', KEYS[4], element, 1)
    end
  end
  if #members == 0 then return members end
  local seq = next_seq(#members)
  local first = #out / 4 - #members
  local args = {}
  for j = 1, #members do
    seq = seq + 1
    out[(first + j - 1) * 4 + 3] = seq
    args[#args + 1] = deadline
    args[#args + 1] = members[j]
    redis.call('HSET', KEYS[3], members[j], seq)
  end
  for i = 1, #args, 2000 do redis.call('ZADD', KEYS[2], unpack(args, i, math.min(i + 1999, #args))) end
  return members
end

take(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit), true)
local room = limit - #out / 4
if room > 0 then
  local due = take(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, room), false)
  for i = 1, #due, 1000 do redis.call('ZREM', KEYS[1], unpack(due, i, math.min(i + 999, #due))) end
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local taken_head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {out, head[2] or '-1', taken_head[2] or '-1', dead}
