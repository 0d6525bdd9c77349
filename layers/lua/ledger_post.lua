-- ledger_post: a credit's event is durable (the broker acknowledged it): release its hold, so it can be spent.
-- KEYS[1] user:balance:{uid}  hash (held: the credits not durable yet)
-- KEYS[2] user:held:{uid}     hash: entry id -> amount of each held credit (ledger_apply)
-- ARGV[1] entry id
-- Returns 1 when the hold was released, 0 when there was none (posted already, settled by the writer, rolled back,
-- or lost with the account).
local amount = redis.call('HGET', KEYS[2], ARGV[1])
if not amount then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('HINCRBY', KEYS[1], 'held', -tonumber(amount)) <= 0 then redis.call('HDEL', KEYS[1], 'held') end
return 1
