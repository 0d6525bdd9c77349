"""Fakes the unit tests share (one of each): stand-ins for our own storage classes, never for Redis, Kafka or the DB
in the integration tests."""

from __future__ import annotations


class FakeOutbox:
    """The outbox's fate claims and dead letters in memory (hotledger/outbox/store.py OutboxStore): a fate key in
    `rolled_back` is one the API rolled back first, so its claim is refused. Records every claim and dead letter."""

    def __init__(self, rolled_back=frozenset()):
        self.rolled_back, self.claims, self.dead = set(rolled_back), [], []

    def claim(self, groups):
        self.claims.append(groups)
        return [[key not in self.rolled_back for key in group] for group in groups]

    def dead_letter(self, cur, records):
        self.dead += records
        return len(records)

    def dead_letter_alone(self, records):
        return self.dead_letter(None, records)
