-- lock_renew: the watchdog extends the lease while its owner still holds the lock.
-- KEYS[1] lock:{<name>}  ARGV[1] owner id  ARGV[2] lease in ms
-- Returns 1 when renewed, 0 when the owner no longer holds it (lease expired, taken over).
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
