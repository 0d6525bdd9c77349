-- inbox_post: write one app-inbox message for an account, once per (biz_type, outer_biz_id), and keep the
-- account's index bounded (messages older than the TTL and all but the newest max_len leave it).
-- KEYS[1] inbox:index:{<account>}                   zset: message id -> created (epoch ms)
-- KEYS[2] inbox:msg:{<account>}:<message id>         string: the message JSON, expires with the TTL
-- KEYS[3] inbox:biz:{<account>}:<len(biz_type)>:<biz_type>:<outer>   string: the message id written for this
--         business event (biz_type length-prefixed: one key per (biz_type, outer_biz_id) pair)
-- ARGV[1] message id  ARGV[2] created (epoch ms)  ARGV[3] message JSON  ARGV[4] TTL in seconds
-- ARGV[5] most messages kept in the index
-- Returns {'new', message id} or {'duplicate', the first message id} (nothing written).
local first = redis.call('GET', KEYS[3])
if first then return {'duplicate', first} end
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[4])
redis.call('SET', KEYS[3], ARGV[1], 'EX', ARGV[4])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (tonumber(ARGV[2]) - tonumber(ARGV[4]) * 1000))
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[5]) + 1))
redis.call('EXPIRE', KEYS[1], ARGV[4])
return {'new', ARGV[1]}
