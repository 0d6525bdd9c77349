-- inbox_pull: ids of the messages after the client's last one, oldest first (the seed's ZRANK + ZRANGE in
-- one step): from the position after ARGV[1], or from the start when ARGV[1] is empty or not in the index
-- (expired, trimmed or unknown). The caller then reads the bodies (MGET, same slot).
-- KEYS[1] inbox:index:{<account>}  zset: message id -> created
-- ARGV[1] last message id the client has ('' for none)  ARGV[2] most ids to return
-- Returns the list of message ids.
local start = 0
if ARGV[1] ~= '' then
  local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
  if rank then start = rank + 1 end
end
return redis.call('ZRANGE', KEYS[1], start, start + tonumber(ARGV[2]) - 1)
