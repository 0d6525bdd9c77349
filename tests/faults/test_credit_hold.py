"""A credit is spendable only once it is durable (issue 19, item 1), through the local runtime with a real broker
paused: a recharge whose publish fails is taken back (503 PUBLISH_FAILED, "nothing changed"), so a deduct made
while it waited for the broker must not spend it. Before, the deduct (answered by another API worker, whose
publish outlived the pause) spent the 100.00 and the recharge's rollback left the balance at -100.00: the DB held
the order and no pay row. Like TigerBeetle's two-phase transfers, a credit is pending (shown in the balance, not
spendable) until its event is acknowledged; a deduct's own rollback (money coming back) stays immediate."""

from __future__ import annotations

import os
import signal
import threading
import time

from faults.test_faults import _converged, stack  # noqa: F401 (fixture)


def test_a_deduct_cannot_spend_a_recharge_whose_publish_then_fails(stack):  # noqa: F811
    # the reconciler persists entries pending past RECONCILE_AGE_S itself: not during this test
    svc = stack.service("credit-hold", PUBLISH_TIMEOUT_S="4", RECONCILE_AGE_S="300").start()
    try:
        status, body = svc.request("POST", "/accounts", {"user_name": f"hold-{time.monotonic_ns()}"})
        assert status == 201, body
        user_id = body["user_id"]
        answers = {}

        def call(name: str, path: str, amount: str) -> None:
            answers[name] = svc.request(
                "POST",
                f"/accounts/{user_id}/{path}",
                {"amount": amount},
                {"Idempotency-Key": f"{name}-{user_id}"},
                timeout=30,
            )

        os.kill(stack.broker.proc.pid, signal.SIGSTOP)
        try:
            recharge = threading.Thread(target=call, args=("recharge", "recharge", "100.00"))
            recharge.start()
            time.sleep(1)  # the recharge is in Redis, waiting for the broker's ack
            deduct = threading.Thread(target=call, args=("deduct", "deduct", "100.00"))
            deduct.start()  # another worker: its publish waits until 5 s from now
            recharge.join()
            time.sleep(0.5)
        finally:
            os.kill(stack.broker.proc.pid, signal.SIGCONT)
        deduct.join()
        assert answers["recharge"][0] == 503 and answers["recharge"][1]["error"]["code"] == "PUBLISH_FAILED", answers
        assert answers["deduct"][0] == 402 and answers["deduct"][1]["error"]["code"] == "INSUFFICIENT_BALANCE", answers
        # retried under their keys, each answers as before: nothing was charged, nothing credited
        call("deduct", "deduct", "100.00")
        assert answers["deduct"][0] == 402, answers
        _converged(stack, svc, user_id, 0)
        assert stack.sql("SELECT COUNT(*) FROM t_order WHERE user_id = %s", (user_id,)) == ((0,),)
        assert stack.sql("SELECT COUNT(*) FROM t_pay WHERE user_id = %s", (user_id,)) == ((0,),)
        # a credit that was acknowledged is spendable at once, and held by nothing
        assert svc.request("POST", f"/accounts/{user_id}/recharge", {"amount": "30.00"})[0] == 200
        assert svc.request("GET", f"/accounts/{user_id}")[1]["held_credits"] == "0.00"
        status, body = svc.request("POST", f"/accounts/{user_id}/deduct", {"amount": "30.00"})
        assert status == 200 and body["balance"] == "0.00", body
    finally:
        svc.stop()
