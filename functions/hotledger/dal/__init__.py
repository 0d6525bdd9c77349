"""Adapters: Redis scripts, MySQL, Kafka. Domain logic talks to these small interfaces only."""
