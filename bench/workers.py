"""Client processes of the benchmarks: one spawned process per worker (Lambda's one request in flight per process),
each handing back one result. A benchmark step always ends: a worker that fails, dies or outlives its time is
reported (WorkerFailed, with its traceback or exit code) and the others are stopped, instead of the parent waiting
on a result that never comes.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback

# spawn and import of a worker (the handler, Powertools, redis-py, confluent-kafka) on a machine shared with other runs
START_ALLOWANCE_S = 60
POLL_S = 0.5


class WorkerFailed(RuntimeError):
    pass


class _Result:
    """The `out` a worker target puts its one result into: tagged with the worker's index."""

    def __init__(self, out, index: int):
        self.out, self.index = out, index

    def put(self, result) -> None:
        self.out.put((self.index, result, None))


def _run(target, index: int, args: tuple, out) -> None:
    try:
        target(*args, _Result(out, index))
    except BaseException:
        out.put((index, None, traceback.format_exc()))
        raise


def gather(target, args_per_worker: list[tuple], timeout_s: float) -> list:
    """Run `target(*args, out)` in one spawned process per `args`; each calls `out.put(result)` once. The results, by
    worker. Raises WorkerFailed when a worker raises, exits without a result, or `timeout_s` passes first."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    workers = [
        ctx.Process(target=_run, args=(target, i, args, out), daemon=True) for i, args in enumerate(args_per_worker)
    ]
    for w in workers:
        w.start()
    deadline = time.monotonic() + timeout_s
    results: dict[int, object] = {}
    try:
        while len(results) < len(workers):
            try:
                index, result, error = out.get(timeout=POLL_S)
            except queue.Empty:
                _check(target.__name__, workers, results, out, deadline, timeout_s)
                continue
            if error is not None:
                raise WorkerFailed(f"{target.__name__} worker {index} failed:\n{error}")
            results[index] = result
        for w in workers:
            w.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for w in workers:
            if w.is_alive():
                w.terminate()
                w.join(5)
    return [results[i] for i in range(len(workers))]


def _check(name: str, workers: list, results: dict, out, deadline: float, timeout_s: float) -> None:
    """Between results: a worker gone without one, or the deadline passed, ends the wait."""
    for index, w in enumerate(workers):
        if index not in results and w.exitcode is not None:
            try:  # it may have put its result just before exiting: the queue's feeder flushed it at exit
                got, result, error = out.get(timeout=POLL_S)
            except queue.Empty:
                raise WorkerFailed(f"{name} worker {index} exited with code {w.exitcode} without a result") from None
            if error is not None:
                raise WorkerFailed(f"{name} worker {got} failed:\n{error}")
            results[got] = result
            return
    if time.monotonic() > deadline:
        waiting = [i for i in range(len(workers)) if i not in results]
        raise WorkerFailed(f"{name} workers {waiting} had no result after {timeout_s:.0f} s (still running: stopped)")
