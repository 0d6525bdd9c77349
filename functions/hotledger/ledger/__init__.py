"""Prepaid accounts: ASYNC charges on Redis made durable through the outbox, SYNC charges in the DB."""
