"""How a red packet's total is cut into its items, once, when it is sent (pure: no I/O).

Double mean: each item is uniform in [1, 2 x the mean of what is left], keeping at least one cent for every
item still to come. Invariants: there are exactly `count` items, every item is >= MIN_ITEM, they sum to the
total exactly, and the same seed gives the same items.
"""

from __future__ import annotations

import random

from hotledger import errors

MIN_ITEM = 1  # one cent


def split(total: int, count: int, rng: random.Random) -> list[int]:
    if count <= 0 or total < count * MIN_ITEM:
        raise errors.TotalTooSmall(f"the total must be at least {count} x 0.01")
    items, left = [], total
    for remaining in range(count, 1, -1):
        high = min(2 * left // remaining, left - (remaining - 1) * MIN_ITEM)
        amount = rng.randint(MIN_ITEM, max(MIN_ITEM, high))
        items.append(amount)
        left -= amount
    items.append(left)
    return items
