"""hotledger: prepaid balances on Redis Lua, persisted through Kafka into MySQL."""
