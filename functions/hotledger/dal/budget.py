"""The work budget of one part of a scheduled run (the reconciler's accounts, vouchers, packets, ...): an item
budget and a time budget, whichever runs out first. A part that runs out stops at a page boundary and reports where
it stopped; the next run continues from there (the cursor), so one part can neither overrun the run's timeout nor
starve the parts after it."""

from __future__ import annotations

import time
from collections.abc import Callable


class Budget:
    def __init__(self, items: int, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.items_left, self.clock = items, clock
        self.deadline = clock() + seconds

    @classmethod
    def unlimited(cls) -> Budget:
        return cls(2**62, 10.0**9)

    def spend(self, items: int = 1) -> None:
        self.items_left -= items

    @property
    def exhausted(self) -> bool:
        return self.items_left <= 0 or self.clock() >= self.deadline

    def page(self, page: int) -> int:
        """How many items the next page may take."""
        return max(0, min(page, self.items_left))
