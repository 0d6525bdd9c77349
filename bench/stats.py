"""The arithmetic of the benchmarks, kept apart so it is tested (tests/unit/test_bench_stats.py): percentiles that
say when they have too few samples, rates over the measured window only, the latency knee, entities per GiB.
No figure is ever asserted: these only compute them."""

from __future__ import annotations

import math

# a percentile is reported only over enough samples to have one: p99 needs 100 (its rank is then the 99th), p99.9
# 1,000; with fewer it is None ("not enough samples"), never the maximum of a handful passed off as a p99
MIN_SAMPLES = {0.5: 2, 0.9: 10, 0.99: 100, 0.999: 1000}
GIB = 1 << 30


def percentile(values: list[float], q: float, digits: int = 2) -> float | None:
    """The q-quantile by nearest rank (the smallest value with at least q of the samples at or below it); None when
    there are fewer samples than MIN_SAMPLES asks for that q."""
    needed = MIN_SAMPLES.get(q, math.ceil(1 / (1 - q)) if q < 1 else 1)
    if len(values) < needed:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return round(ordered[rank - 1], digits)


def in_window(samples: list[tuple[float, ...]], start: float, end: float) -> list[tuple[float, ...]]:
    """The samples whose first field (when they started) falls in [start, end): warm-up before, drain after, left out."""
    return [s for s in samples if start <= s[0] < end]


def rate(count: int, start: float, end: float) -> float:
    """count over the window [start, end] it was counted in (seconds)."""
    if end <= start:
        raise ValueError(f"an empty window: {start} .. {end}")
    return round(count / (end - start), 1)


def knee(steps: list[tuple[float, float | None]], limit_ms: float = 50.0) -> float | None:
    """The lowest offered rate whose p99 passed `limit_ms` (a step with no p99, all failed, counts as past it), or
    None when no step in the range did: the knee is then above the highest rate tried."""
    for offered, p99 in sorted(steps, key=lambda s: s[0]):
        if p99 is None or p99 > limit_ms:
            return offered
    return None


def per_gib(bytes_per_entity: float) -> int:
    """How many such entities one GiB of Redis memory holds (dataset only: no overhead or fragmentation margin)."""
    if bytes_per_entity <= 0:
        raise ValueError(f"bytes per entity must be positive, not {bytes_per_entity}")
    return int(GIB // bytes_per_entity)


def ratio(numerator: float | None, denominator: float | None, digits: int = 2) -> float | None:
    """numerator / denominator, None when either is missing or the denominator is 0 (a figure that was not measured
    gives no ratio, rather than a division by a made-up floor)."""
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, digits)
