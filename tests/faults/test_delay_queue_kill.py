"""100,000 elements, random removes and re-offers, the drainer SIGKILLed mid-drain and replaced: every element
that was not removed is handled (its effect recorded exactly once, by an idempotent handler), none early."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from hotledger import keys
from hotledger.runtime import delay_queue, lua

REPO = Path(__file__).resolve().parents[2]

_DRAINER = """
import os, sys, time
import pymysql
from hotledger.dal.delay_queue import DelayQueue, Drainer
from hotledger.runtime import lua
queue, table = sys.argv[1], sys.argv[2]
conn = pymysql.connect(host=os.environ["DB_HOST"], port=int(os.environ["DB_PORT"]), user=os.environ["DB_USER"],
                       password=os.environ["DB_PASSWORD"], database=os.environ["DB_NAME"], autocommit=True)

def handle(elements):
    # idempotent: the effect is keyed by the element; a redelivery only counts the delivery
    now = int(time.time() * 1000)
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO {table} (element, handled_at) VALUES " + ",".join(["(%s,%s)"] * len(elements))
                    + " ON DUPLICATE KEY UPDATE deliveries = deliveries + 1", [x for e in elements for x in (e, now)])

Drainer(DelayQueue(lua(), visibility_ms=1500), {queue: handle}, batch=500).run(lambda: True)
"""


def _start_drainer(queue: str, table: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _DRAINER, queue, table],
        cwd=REPO,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'functions'}:{REPO}"},
    )


def test_hundred_thousand_elements_drainer_killed_mid_drain(sql, redis_client):
    queue, table = f"kill-{uuid.uuid4().hex[:8]}", f"t_delay_handled_{uuid.uuid4().hex[:8]}"
    sql(
        f"CREATE TABLE {table} (element VARCHAR(64) PRIMARY KEY, handled_at BIGINT NOT NULL, deliveries INT NOT NULL DEFAULT 1)"
    )
    rng = random.Random(42)
    base = int(time.time() * 1000) + 8000  # room for the setup below
    due = {f"e{i}": base + i * 6000 // 100_000 for i in range(100_000)}  # due over 6 s
    runner = lua()
    remove_keys = [
        keys.delay_due(queue),
        keys.delay_taken(queue),
        keys.delay_receipts(queue),
        keys.delay_deliveries(queue),
        keys.delay_dead(queue),
    ]
    pipe = redis_client.pipeline(transaction=False)
    for element, at in due.items():
        runner.run("delay_offer", keys.delay_offer_keys(queue), [element, at], client=pipe)
    pipe.execute()
    removed = set(rng.sample(sorted(due), 10_000))
    for element in removed:
        runner.run("delay_remove", remove_keys, [element], client=pipe)
    assert pipe.execute() == [1] * 10_000
    for element in rng.sample(sorted(set(due) - removed), 10_000):  # re-offered: one entry, due time moved
        due[element] = base + rng.randrange(0, 8000)
        runner.run("delay_offer", keys.delay_offer_keys(queue), [element, due[element]], client=pipe)
    assert [added for added, _ in pipe.execute()] == [0] * 10_000
    expected = {e: at for e, at in due.items() if e not in removed}
    assert delay_queue().size(queue) == (90_000, 0)

    first = _start_drainer(queue, table)
    try:
        time.sleep(max(0.0, base / 1000 - time.time() + 3))  # about half way through the due times
        os.killpg(first.pid, signal.SIGKILL)  # mid-drain: some elements taken and not acknowledged
        first.wait()
        handled_before = sql(f"SELECT COUNT(*) FROM {table}")[0][0]
        assert 0 < handled_before < 90_000
        second = _start_drainer(queue, table)
        try:
            deadline = time.monotonic() + 60
            while sql(f"SELECT COUNT(*) FROM {table}")[0][0] < 90_000 and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(2)  # anything handled twice would show now
        finally:
            os.killpg(second.pid, signal.SIGKILL)
            second.wait()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    found = sql(f"SELECT element, handled_at, deliveries FROM {table}")
    rows = {element: handled_at for element, handled_at, _ in found}
    assert rows.keys() == expected.keys()  # every element not removed, none of the removed
    early = [e for e, at in rows.items() if at < expected[e]]
    assert early == []
    # redelivered: only what the killed drainer had taken and not acknowledged (at most its batch in hand), once
    redelivered = [deliveries for _, _, deliveries in found if deliveries > 1]
    assert len(redelivered) <= 500 and set(redelivered) <= {2}
    assert delay_queue().size(queue) == (0, 0) and delay_queue().stats(queue).dead == 0
    assert redis_client.hlen(keys.delay_deliveries(queue)) == 0 and redis_client.hlen(keys.delay_receipts(queue)) == 0
    sql(f"DROP TABLE {table}")
