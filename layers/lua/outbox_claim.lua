-- outbox_claim: the writer takes entries of one account before committing them to the DB, so a late
-- ledger_rollback (publish timed out but the event did arrive) can no longer undo a persisted entry.
-- KEYS[1..n] user:order:fate:{uid}:<id>   one per entry, all of the same account
-- ARGV[1] fate TTL in seconds
-- Returns an array of n integers: 1 claimed (persist it), 0 rolled back (skip it).
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == 'rolledback' then
    out[i] = 0
  else
    redis.call('SET', key, 'claimed', 'EX', ARGV[1])
    out[i] = 1
  end
end
return out
