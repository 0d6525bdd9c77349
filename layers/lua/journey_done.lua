-- journey_done: drop a journey the scan has reminded about, unless it was finished and started again
-- meanwhile (its start time changed: that new start gets its own reminder).
-- KEYS[1] journey:{journey-<biz>}  zset: account -> started (epoch ms)
-- ARGV[1] account  ARGV[2] the start time the reminder was for
-- Returns 1 when removed, 0 when the journey is gone or newer.
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
