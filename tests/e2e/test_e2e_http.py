"""End to end over HTTP on the local runtime: API workers, the MSK consumer and the schedule, all as
real processes against real Redis, MariaDB and the Kafka-protocol broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import REPO, LocalService
from hotledger import keys
from infra import services


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = LocalService(
        services.free_port(),
        {
            "HOTLEDGER_LOCAL_SCHEDULE_RATE_S": "2",
            "RECONCILE_AGE_S": "60",
            "HOTLEDGER_API_WORKERS": "4",
            "REMINDER_BEFORE_CLOSE_S": "3",
        },
        tmp_path_factory.mktemp("e2e") / "runtime.log",
    )
    svc.start()
    yield svc
    svc.stop()


def _persisted(service, user_id, order_id) -> bool:
    return service.request("GET", f"/accounts/{user_id}/orders/{order_id}")[1]["status"] == "PERSISTED"


def test_create_recharge_deduct_until_persisted(service, sql, redis_client):
    status, body = service.request("POST", "/accounts", {"user_name": f"e2e-{os.getpid()}", "threshold": "0.00"})
    assert status == 201
    user_id = body["user_id"]
    assert service.request("POST", f"/accounts/{user_id}/recharge", {"amount": "100.00"})[0] == 200
    status, order = service.request("POST", f"/accounts/{user_id}/deduct", {"amount": "12.34"})
    assert status == 200 and order["balance"] == "87.66"
    service.wait_until(lambda: _persisted(service, user_id, order["order_id"]), 60, "the order to be persisted")
    service.wait_until(
        lambda: service.request("GET", f"/accounts/{user_id}")[1]["pending_orders"] == 0, 30, "pending 0"
    )
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((8766,),)
    assert redis_client.hget(keys.balance(user_id), "balance") == b"8766"
    assert sql("SELECT amount, balance, mode FROM t_order WHERE id = %s", (int(order["order_id"]),)) == (
        (1234, 8766, "ASYNC"),
    )


def test_bad_input_over_http_changes_nothing(service):
    status, body = service.request("POST", "/accounts", {"user_name": f"e2e-bad-{os.getpid()}"})
    user_id = body["user_id"]
    for amount in ("-1", "1.001", "1e2", "NaN"):
        status, answer = service.request("POST", f"/accounts/{user_id}/recharge", {"amount": amount})
        assert status == 422 and answer["error"]["code"] == "INVALID_AMOUNT"
    assert service.request("GET", f"/accounts/{user_id}")[1]["balance"] == "0.00"


def test_thousand_parallel_deducts_on_five_hundred(service, sql, redis_client):
    status, body = service.request("POST", "/accounts", {"user_name": f"e2e-hot-{os.getpid()}"})
    user_id = body["user_id"]
    assert service.request("POST", f"/accounts/{user_id}/recharge", {"amount": "500.00"})[0] == 200

    def deduct(_):
        return service.request("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})

    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(deduct, range(1000)))
    statuses = [status for status, _ in answers]
    assert statuses.count(200) == 500, {s: statuses.count(s) for s in set(statuses)}
    assert set(statuses) <= {200, 402, 403}
    assert len({body["order_id"] for status, body in answers if status == 200}) == 500
    assert service.request("GET", f"/accounts/{user_id}")[1]["balance"] == "0.00"
    service.wait_until(
        lambda: sql("SELECT COUNT(*) FROM t_order WHERE user_id = %s", (user_id,))[0][0] == 500,
        90,
        "500 orders in the DB",
    )
    service.wait_until(lambda: redis_client.zcard(keys.pending(user_id)) == 0, 30, "nothing pending")
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((0,),)


def test_order_close_reminder_reaches_the_inbox_once_and_on_time(service):
    """The scheduled delay drainer fires the reminder 3 s (REMINDER_BEFORE_CLOSE_S) before the close time."""
    status, body = service.request("POST", "/accounts", {"user_name": f"e2e-remind-{os.getpid()}"})
    user_id = body["user_id"]
    assert service.request("POST", f"/accounts/{user_id}/recharge", {"amount": "10.00"})[0] == 200
    status, unpaid = service.request("POST", "/orders", {"user_id": user_id, "amount": "3.00", "close_in_s": 6})
    assert status == 201 and unpaid["reminder_due_at"] == unpaid["close_at"] - 3000
    paid = service.request("POST", "/orders", {"user_id": user_id, "amount": "4.00", "close_in_s": 6})[1]
    assert service.request("POST", f"/orders/{paid['order_id']}/pay")[1]["state"] == "PAID"

    def inbox():
        return service.request("GET", f"/inbox/{user_id}/messages")[1]["messages"]

    service.wait_until(lambda: inbox(), 30, "the reminder in the inbox")
    time.sleep(2)
    messages = inbox()
    assert [(m["biz_type"], m["outer_biz_id"]) for m in messages] == [("ORDER_CLOSE_REMINDER", unpaid["order_id"])]
    assert messages[0]["created_at"] >= unpaid["reminder_due_at"]  # never early
    assert service.request("GET", f"/accounts/{user_id}")[1]["balance"] == "6.00"


def test_api_key_is_required_when_configured(tmp_path):
    """API Gateway's usage-plan check, as the local runtime applies it when HOTLEDGER_API_KEY is set."""
    svc = LocalService(
        services.free_port(),
        {"HOTLEDGER_API_KEY": "k-123", "HOTLEDGER_API_WORKERS": "1"},
        tmp_path / "keyed.log",
        ("--no-msk", "--no-schedules"),
    )
    try:
        svc.start(wait_http=False)
        LocalService.wait_until(lambda: svc.request("GET", "/openapi.json")[0] == 403, 30, "the keyed API to answer")
        assert svc.request("GET", "/openapi.json", headers={"x-api-key": "wrong"})[0] == 403
        assert svc.request("GET", "/openapi.json", headers={"x-api-key": "k-123"})[0] == 200
    finally:
        svc.stop()


def test_no_function_failed_while_serving(service):
    """Last in this module: every invocation the runtime made for the tests above (API, MSK writer,
    schedules) returned without an exception."""
    log = service.log_text()
    assert "Traceback" not in log, log[log.index("Traceback") - 300 : log.index("Traceback") + 2000]


def test_a_recharge_published_straight_to_the_topic_is_dead_lettered_by_the_msk_consumer(service, sql, settings):
    """Anyone who can reach the topic publishes a recharge with kafka-python: the local runtime's MSK consumer hands it
    to the writer, which dead-letters it (no MAC) and changes nothing; the service's own charges go on."""
    from kafka import KafkaProducer

    status, body = service.request("POST", "/accounts", {"user_name": f"e2e-forge-{os.getpid()}"})
    user_id = body["user_id"]
    assert service.request("POST", f"/accounts/{user_id}/recharge", {"amount": "10.00"})[0] == 200
    service.wait_until(
        lambda: service.request("GET", f"/accounts/{user_id}")[1]["pending_orders"] == 0, 60, "persisted"
    )
    ((balance, version),) = sql("SELECT balance, version FROM t_account WHERE user_id = %s", (user_id,))
    forged = {
        "type": "ledger",
        "id": 9_000_000_000_000 + user_id,
        "kind": "R",
        "user_id": user_id,
        "amount": 100_000_000,
        "balance_after": balance + 100_000_000,
        "version": version + 1,
        "epoch": "forged",
        "ts": int(time.time() * 1000),
        "open": "1",
        "idem_key": None,
    }
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap.split(","), acks="all")
    producer.send(settings.kafka_topic, key=str(user_id).encode(), value=json.dumps(forged).encode()).get(timeout=30)
    producer.close()
    service.wait_until(
        lambda: sql(
            "SELECT error FROM t_dead_letter WHERE record_key = %s AND topic = %s",
            (str(user_id).encode(), settings.kafka_topic),
        ),
        60,
        "the forged record dead-lettered",
    )
    ((error,),) = sql(
        "SELECT error FROM t_dead_letter WHERE record_key = %s AND topic = %s",
        (str(user_id).encode(), settings.kafka_topic),
    )
    assert error.startswith("forged: the record carries no signature")
    status, order = service.request("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    assert status == 200 and order["balance"] == "9.00"
    service.wait_until(lambda: _persisted(service, user_id, order["order_id"]), 60, "the genuine deduct persisted")
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((900,),)  # before: 1,000,009.00
    assert sql("SELECT COUNT(*) FROM t_pay WHERE user_id = %s", (user_id,)) == ((1,),)


def _ops(service, *args: str) -> subprocess.CompletedProcess:
    """`hotledger ops` against this runtime, as an operator runs it (`make ops ARGS=...`)."""
    return subprocess.run(
        [sys.executable, "-m", "infra.ops", "--api", service.base, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_the_operators_console_over_http(service):
    """Issue 21: `hotledger ops` through the admin routes of the local runtime (its dev issuer's admin token)."""
    status, body = service.request("POST", "/accounts", {"user_name": f"e2e-ops-{os.getpid()}"})
    user_id = body["user_id"]
    assert service.request("POST", f"/accounts/{user_id}/recharge", {"amount": "5.00"})[0] == 200
    service.wait_until(
        lambda: service.request("GET", f"/accounts/{user_id}")[1]["pending_orders"] == 0, 60, "persisted"
    )

    shown = _ops(service, "--json", "account", str(user_id))
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert (view["db"]["balance"], view["redis"]["balance"], view["pending"], view["agrees"]) == (500, 500, [], True)
    table = _ops(service, "account", str(user_id))
    assert table.returncode == 0 and f"account {user_id}: agrees" in table.stdout, table.stdout + table.stderr

    service.wait_until(
        lambda: all(p["last_run"] for p in json.loads(_ops(service, "--json", "reconciler").stdout)),
        60,
        "every reconciler part to have run on the schedule",
    )
    assert _ops(service, "reconciler").returncode == 0
    listed = _ops(service, "--json", "dead-letters")
    assert listed.returncode == 0 and set(json.loads(listed.stdout)) == {
        "writer",
        "topic",
        "stream",
        "webhook",
        "delay",
    }
    replayed = _ops(service, "--json", "replay", "webhook")
    assert replayed.returncode == 0, replayed.stderr
    assert _ops(service, "--json", "log").returncode == 0

    refused = _ops(service, "--token", "not-a-token", "reconciler")
    # the template's default front door (FrontDoor http): the JWT authorizer's own refusal, before the function
    assert refused.returncode == 1 and "/ops/reconciler: 401" in refused.stderr and "Unauthorized" in refused.stderr
    bad = _ops(service, "account", "0")
    assert bad.returncode == 2 and "Invalid value" in bad.stderr  # refused before any call
