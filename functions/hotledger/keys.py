"""Redis key layout. Every key of one account carries the user id as a hash tag ({uid}),
so each script's keys land in one Redis Cluster slot."""


def balance(user_id: int) -> str:
    return f"user:balance:{{{user_id}}}"


def entry(user_id: int, entry_id: int) -> str:
    """Deduct or recharge not yet persisted: 'amount;ts;balanceAfter;version;kind;epoch;open'."""
    return f"user:order:{{{user_id}}}:{entry_id}"


def consistency(user_id: int) -> str:
    """Zset of entry ids charged in Redis and not yet in the DB, scored by time (ms)."""
    return f"user:order:consistency:{{{user_id}}}"


def fate(user_id: int, entry_id: int) -> str:
    """'claimed' by the writer or 'rolledback' by the API: whichever comes first wins."""
    return f"user:order:fate:{{{user_id}}}:{entry_id}"


def idempotency(user_id: int, idem_key: str) -> str:
    return f"user:idem:{{{user_id}}}:{idem_key}"


def lock(user_id: int) -> str:
    return f"user:lock:{{{user_id}}}"


IDGEN_WORKER_PREFIX = "idgen:worker:"
