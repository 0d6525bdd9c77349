"""Red packets: pre-split items grabbed by one Lua script, claims persisted through the outbox, credits and refunds through the ledger."""
