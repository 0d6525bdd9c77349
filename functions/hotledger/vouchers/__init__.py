"""Vouchers (flash sales): stock sold in Redis by one Lua script, orders persisted through the outbox.
service.py takes and answers orders, persist.py is the writer's side, reconcile.py the reconciler's, store.py
holds every SQL statement, Redis key and script call of the feature."""
