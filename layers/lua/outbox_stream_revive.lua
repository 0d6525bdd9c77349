-- outbox_stream_revive: an operator's replay of one dead stream entry: appended again to its stream, removed from the
-- dead entries in the same step, so a second replay of it finds nothing (never two copies in the stream).
-- KEYS[1] the shard's dead entries (events:dead:{s<n>})  KEYS[2] the shard's stream (events:{s<n>})
-- ARGV[1] the dead entry's id
-- Returns the new entry's id in the stream, or false when the dead entry is not there (replayed already, or no such entry).
local found = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #found == 0 then return false end
local fields = found[1][2]
local value
for i = 1, #fields, 2 do
  if fields[i] == 'e' then value = fields[i + 1] end
end
redis.call('XDEL', KEYS[1], ARGV[1])
if not value then return false end
return redis.call('XADD', KEYS[2], '*', 'e', value)
