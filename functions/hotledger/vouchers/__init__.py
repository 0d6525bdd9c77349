"""Flash sales: vouchers whose stock is sold by one Lua script and persisted through the outbox."""
