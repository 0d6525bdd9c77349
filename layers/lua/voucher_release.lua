-- voucher_release: end a buyer's 'away' reservation in the home bucket (voucher_order reserved the slot, the unit
-- was to come from another bucket). All keys share the home bucket's hash tag.
-- KEYS[1] voucher:{..}  (dry:<k> fields)  KEYS[2] voucher:buyers:{..}  KEYS[3] voucher:away:{..}
-- ARGV[1] order id  ARGV[2] user id
-- ARGV[3] 'give_back': no unit was taken (or it was given back): the buyer's slot is freed;
--         'keep': the order stands (the DB holds it): only the away record goes
-- ARGV[4] seen-empty marks last until (epoch ms)  ARGV[5..] buckets just seen empty: later buyers of this home skip
--         them until ARGV[4] (a unit given back there sells to its own home's buyers at once, to all after that)
-- Returns {'released'} when the away record was there, {'gone'} when not (nothing changed in the buyer's slot).
for i = 5, #ARGV do redis.call('HSET', KEYS[1], 'dry:' .. ARGV[i], ARGV[4]) end
if redis.call('HDEL', KEYS[3], ARGV[1]) == 0 then return {'gone'} end
if ARGV[3] == 'give_back' and redis.call('HINCRBY', KEYS[2], ARGV[2], -1) <= 0 then
  redis.call('HDEL', KEYS[2], ARGV[2])
end
return {'released'}
