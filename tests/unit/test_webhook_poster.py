"""Issue 32 item 14: the in-VPC sender's side of the poster (hotledger.webhooks.service.lambda_poster): each attempt
is one synchronous Lambda invoke of the request as JSON; what the poster answers is the attempt; a poster that failed
or could not be invoked is the attempt's failure, never an exception out of the sender."""

from __future__ import annotations

import io
import json

import pytest

from hotledger.webhooks import service

REQUEST: service.Request = {
    "url": "https://hooks.example.com/x",
    "headers": {"webhook-id": "evt_1", "webhook-signature": "v1,abc"},
    "body": "{}",
    "timeout_s": 15.0,
}


class FakeLambda:
    def __init__(self, answer=None, error: Exception | None = None):
        self.answer, self.error, self.calls = answer, error, []

    def invoke(self, **kwargs):
        self.calls.append(kwargs)
        if self.error:
            raise self.error
        return self.answer


@pytest.fixture
def lambda_client(monkeypatch):
    import boto3

    def install(fake: FakeLambda) -> FakeLambda:
        monkeypatch.setattr(boto3, "client", lambda name, **_: fake)
        return fake

    return install


def test_the_posters_answer_is_the_attempt(lambda_client):
    fake = lambda_client(FakeLambda({"Payload": io.BytesIO(b'{"status": 503, "retry_after": "7"}')}))
    assert service.lambda_poster("poster")(REQUEST) == {"status": 503, "retry_after": "7"}
    (call,) = fake.calls
    assert call["FunctionName"] == "poster" and json.loads(call["Payload"]) == REQUEST


def test_a_failed_or_unreachable_poster_is_the_attempts_failure(lambda_client):
    lambda_client(FakeLambda({"FunctionError": "Unhandled", "Payload": io.BytesIO(b'{"errorMessage": "boom"}')}))
    assert service.lambda_poster("poster")(REQUEST)["error"].startswith("the poster failed")
    lambda_client(FakeLambda(error=TimeoutError("read timed out")))
    answer = service.lambda_poster("poster")(REQUEST)
    assert answer == {"error": "the poster could not be invoked: TimeoutError: read timed out"}
