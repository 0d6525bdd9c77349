"""Events from Redis-side changes to the DB: their shapes, making a change durable, the batch writer, the Redis Streams consumer."""
