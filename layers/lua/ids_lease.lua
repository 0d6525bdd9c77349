-- ids_lease: release or renew a key only while it still holds our token (locks, id-worker leases).
-- KEYS[1] the lease key
-- ARGV[1] owner token  ARGV[2] 'release' | 'renew'  ARGV[3] lease in ms (renew only)
-- Returns 1 when done, 0 when the key is gone or owned by someone else.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == 'release' then return redis.call('DEL', KEYS[1]) end
return redis.call('PEXPIRE', KEYS[1], ARGV[3])
