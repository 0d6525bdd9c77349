"""Structured logs and EMF metrics, read from what the handlers print (what CloudWatch would receive)."""

import io
import json
import os

import pytest

from helpers import caller_context, invoke_writer
from infra.localrt import events


def _lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _metrics(lines: list[dict]) -> dict[str, tuple[list, dict]]:
    """metric name -> (values, dimensions) from the EMF blobs among the printed lines."""
    found = {}
    for blob in lines:
        for directive in blob.get("_aws", {}).get("CloudWatchMetrics", []):
            dimensions = {name: blob[name] for group in directive["Dimensions"] for name in group}
            for metric in directive["Metrics"]:
                found[metric["Name"]] = (blob[metric["Name"]], dimensions)
    return found


class Output:
    """What the handlers print: EMF metrics (stdout) and log lines (the Powertools handler's stream)."""

    def __init__(self, capfd, log_stream: io.StringIO):
        self.capfd, self.log_stream = capfd, log_stream

    def clear(self) -> None:
        self.capfd.readouterr()
        self.log_stream.seek(0)
        self.log_stream.truncate()

    def metrics(self) -> dict[str, tuple[list, dict]]:
        return _metrics(_lines(self.capfd.readouterr().out))

    def logs(self, message: str) -> list[dict]:
        return [line for line in _lines(self.log_stream.getvalue()) if line["message"] == message]


@pytest.fixture
def output(capfd):
    """The suite logs at WARNING; here at INFO (the template's LOG_LEVEL), into a stream of our own."""
    from api.app import logger

    # every function's Logger has the service name: they share one Python logger and handler
    log_stream, handler = io.StringIO(), logger.registered_handler
    level, stream = logger.log_level, handler.setStream(log_stream)
    logger.setLevel("INFO")
    yield Output(capfd, log_stream)
    logger.setLevel(level)
    handler.setStream(stream)


def _invoke_api(method: str, path: str, body: dict) -> tuple[dict, dict]:
    from api.app import handler

    event = events.api_gateway_proxy(method, path, json.dumps(body), authorizer=caller_context())
    return event, handler(event, events.LambdaContext("ApiFunction"))


def test_a_deduct_logs_its_entry_with_the_request_id_and_counts_it(api, output):
    user_id = api.account(balance="1.00")
    output.clear()
    event, response = _invoke_api("POST", f"/accounts/{user_id}/deduct", {"amount": "0.40"})
    assert response["statusCode"] == 200
    charged = output.logs("deducted")
    assert len(charged) == 1
    assert charged[0]["correlation_id"] == event["requestContext"]["requestId"]
    assert charged[0]["entry_id"] == json.loads(response["body"])["order_id"]
    assert charged[0]["amount_minor"] == 40 and charged[0]["balance_minor"] == 60
    metrics = output.metrics()
    assert metrics["Deducts"] == ([1.0], {"service": "hotledger"})
    assert metrics["ApiRequests"][0] == [1.0]


def test_a_rejection_is_counted_by_its_code(api, output):
    user_id = api.account(balance="1.00")
    output.clear()
    event, response = _invoke_api("POST", f"/accounts/{user_id}/deduct", {"amount": "5.00"})
    assert response["statusCode"] == 402
    metrics = output.metrics()
    assert metrics["Rejections"] == ([1.0], {"code": "INSUFFICIENT_BALANCE"})
    assert "Deducts" not in metrics
    rejected = output.logs("rejected")
    assert rejected[0]["code"] == "INSUFFICIENT_BALANCE"
    assert rejected[0]["correlation_id"] == event["requestContext"]["requestId"]


def test_a_publish_failure_is_counted(api, output, monkeypatch):
    from hotledger.dal.publisher import NotAcknowledged
    from hotledger.ledger.feature import ledger

    def broker_down(key: str, value: bytes) -> None:
        raise NotAcknowledged("no acknowledgement in time")

    user_id = api.account(balance="1.00")
    monkeypatch.setattr(ledger().durability, "publish", broker_down)
    output.clear()
    _, response = _invoke_api("POST", f"/accounts/{user_id}/deduct", {"amount": "0.40"})
    assert response["statusCode"] == 503
    metrics = output.metrics()
    assert metrics["PublishFailures"][0] == [1.0]
    assert metrics["Rejections"] == ([1.0], {"code": "PUBLISH_FAILED"})


def test_the_writer_reports_batch_sizes(api, output):
    user_id = api.account()
    output.clear()
    # a topic of its own: the writer tests count the dead letters of the run's topic
    invoke_writer([(0, 1, str(user_id).encode(), b"not json")], topic=f"{os.environ['KAFKA_TOPIC']}.observability")
    metrics = output.metrics()
    assert metrics["WriterBatchSize"][0] == [1.0]
    assert metrics["WriterDeadLettered"][0] == [1.0]
    assert metrics["WriterApplied"][0] == [0.0]


def test_the_reconciler_emits_pending_orders_and_the_oldest_age(api, output):
    from reconciler.app import handler

    user_id = api.account(balance="3.00")
    api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    # each run emits what it reported; runs go on until one reached this account (its 2 entries pending), however
    # small each run's budget (RECONCILE_PART_ITEMS), within two passes over the accounts
    for _ in range(1000):
        output.clear()
        report = handler(events.scheduled(), events.LambdaContext("ReconcilerFunction"))
        metrics = output.metrics()
        assert metrics["PendingOrders"][0] == [float(report["pending"])]
        assert metrics["OldestPendingAge"][0] == [float(report["oldest_pending_age_s"])]
        if report["pending"] >= 2:
            break
    assert report["pending"] >= 2
