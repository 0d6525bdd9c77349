"""Shared mechanisms: the Redis connection and script runner, MySQL connections and transactions, the Kafka
publisher, the distributed lock, the delay queue and the id generator. No feature logic lives here."""
