-- lib/rebuild_hold: the one check of an account rebuilt after a Redis loss (ledger_load's hold_until and hold_log;
-- outbox/log_hold.py), shared by every script that changes an account on the strength of what Redis remembers
-- (ledger_apply: a key neither Redis nor the DB knows; hold_change: a hold's capture, void or expiry;
-- ledger_grant_expire: a grant's expiry, which a spend still in the log may have taken from). Included where
-- a script says `--! include rebuild_hold` (dal/redis_store.script_text).
-- rebuild_hold(key, hold_until, hold_log, now) -> nil when the change may go on, else the reply that holds it:
--   {'recovering', until}  before hold_until: the account's own records may still be on their way to the DB
--   {'held', until}        past hold_until while hold_log is set: this caller checks the writer's watermark (the
--                          others answer 'recovering' for a second: hold_until moves on by 1 s)
local function rebuild_hold(key, hold_until, hold_log, now)
  if not hold_until then return nil end
  if now < tonumber(hold_until) then return {'recovering', hold_until} end
  if hold_log then
    redis.call('HSET', key, 'hold_until', now + 1000)
    return {'held', string.format('%d', now + 1000)}
  end
  return nil
end
