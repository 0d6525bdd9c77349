"""Payment orders with close reminders, the app inbox and unfinished-business journeys.

payment_orders.py, inbox.py and journeys.py are the services (no SQL, no Redis); store.py holds the
t_payment_order statements, the inbox's and journeys' Redis keys and the typed wrappers of inbox_post.lua,
inbox_pull.lua and journey_done.lua. Payment orders pay through the ledger's service and are timed by the
shared delay queue (hotledger.dal.delay_queue) under the shared distributed lock (hotledger.dal.lock)."""
