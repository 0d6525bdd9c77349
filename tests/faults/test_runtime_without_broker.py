"""The local runtime starts without the broker and serves once it appears (issue 19, item 15), as a Lambda needs no
broker to start: the API answers at once, charges answer 503 and change nothing until the broker is there, and then
the writer persists what is charged."""

from __future__ import annotations

from faults.test_faults import _converged, stack  # noqa: F401 (fixture)
from helpers import LocalService
from infra import services


def test_the_runtime_starts_without_the_broker_and_serves_once_it_appears(stack):  # noqa: F811
    stack.broker.kill()
    svc = stack.service("no-broker").start()  # waits for the API to answer
    try:
        status, body = svc.request("POST", "/accounts", {"user_name": "before-the-broker"})
        assert status == 201, body
        user_id = body["user_id"]
        status, body = svc.request("POST", f"/accounts/{user_id}/recharge", {"amount": "5.00"})
        assert (status, body["error"]["code"]) == (503, "PUBLISH_FAILED"), body
        assert svc.request("GET", f"/accounts/{user_id}")[1]["balance"] == "0.00"  # nothing changed
        stack.broker.restart()
        services.ensure_topic(stack.broker.bootstrap, stack.topic, 2)

        def recharged():
            return (
                svc.request(
                    "POST", f"/accounts/{user_id}/recharge", {"amount": "5.00"}, {"Idempotency-Key": f"after-{user_id}"}
                )[0]
                == 200
            )

        LocalService.wait_until(recharged, 60, "a charge acknowledged once the broker is there", 1.0)
        _converged(stack, svc, user_id, 500)  # and the writer persisted it
    finally:
        svc.stop()
