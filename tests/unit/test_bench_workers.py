"""bench/workers.py: a benchmark step waiting on its client processes always ends; a worker that raises, dies or
blocks is reported instead of the wait hanging (the hot voucher step on the Redis Cluster hung in sale._spawn:
`out.get()` with no timeout, for a result a dead worker never put)."""

from __future__ import annotations

import os
import time

import pytest

from bench import workers


def _answers(value: int, out) -> None:
    out.put(value * 2)


def _raises(value: int, out) -> None:
    if value == 1:
        raise ConnectionError("no route to the cluster")
    out.put(value)


def _exits(value: int, out) -> None:
    if value == 1:
        os._exit(3)
    out.put(value)


def _blocks(value: int, out) -> None:
    if value == 1:
        time.sleep(600)
    out.put(value)


def test_results_come_back_by_worker():
    assert workers.gather(_answers, [(1,), (2,), (3,)], timeout_s=60) == [2, 4, 6]


def test_a_worker_that_raises_is_reported_with_its_traceback():
    with pytest.raises(
        workers.WorkerFailed, match="(?s)_raises worker 1 failed.*ConnectionError: no route to the cluster"
    ):
        workers.gather(_raises, [(0,), (1,)], timeout_s=60)


def test_a_worker_that_dies_without_a_result_is_reported_with_its_exit_code():
    with pytest.raises(workers.WorkerFailed, match="_exits worker 1 exited with code 3 without a result"):
        workers.gather(_exits, [(0,), (1,)], timeout_s=60)


def test_a_worker_that_blocks_past_the_timeout_is_stopped_and_reported():
    with pytest.raises(workers.WorkerFailed, match=r"_blocks workers \[1\] had no result after 5 s"):
        workers.gather(_blocks, [(0,), (1,)], timeout_s=5)
