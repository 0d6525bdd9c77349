-- outbox_claim: a persister takes the changes of one entity (account, voucher, red packet) before committing
-- them to the DB, so a late rollback (publish timed out but the event did arrive) can no longer undo a
-- persisted change, and a change already rolled back is never persisted.
-- KEYS[1..n] fate keys of one slot, e.g. user:order:fate:{uid}:<id>, one per change
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
