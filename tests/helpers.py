"""What the tests share: driving the handlers with real event shapes (Api, invoke_writer, reconcile), rebuilding
the records the broker holds from Redis, and the local runtime as a real child process spoken to over HTTP.

Who the tests act as, in one place: unless a test says otherwise, a backend holding both the service and the admin
scope (TRUSTED_SCOPES): as authorizer context for the handler (caller_context), as a local dev issuer token over
HTTP (token_for)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
import uuid
from pathlib import Path

from infra.localrt import events

REPO = Path(__file__).resolve().parents[1]
EVENTS = REPO / "events"
TRUSTED_SCOPES = ("service", "admin")


def caller_context(user_id: int | None = None, scopes: tuple[str, ...] = TRUSTED_SCOPES, ttl_s: int = 3600) -> dict:
    """requestContext.authorizer as API Gateway passes the authorizer's answer (functions/authorizer) to the API."""
    from infra import dev_issuer

    return dev_issuer.caller_context(user_id, scopes, ttl_s)


_tokens: dict[tuple, tuple[str, float]] = {}


def token_for(user_id: int | None = None, scopes: tuple[str, ...] = TRUSTED_SCOPES) -> str:
    """A local dev issuer token (what `make token` prints), minted again when half its hour is gone."""
    from infra import dev_issuer

    key = (user_id, scopes)
    if key not in _tokens or _tokens[key][1] < time.monotonic() - 1800:
        _tokens[key] = (dev_issuer.token(user_id, scopes), time.monotonic())
    return _tokens[key][0]


TRUSTED = object()  # LocalService.request's default: the TRUSTED_SCOPES token


class Api:
    """Calls the API function's handler with API Gateway REST proxy events, as the caller given: by default the
    trusted backend; Api(user_id=7, scopes=()) an end user; Api(anonymous=True) no authorizer context at all."""

    def __init__(self, user_id: int | None = None, scopes: tuple[str, ...] = TRUSTED_SCOPES, anonymous: bool = False):
        from api.app import handler

        self.handler = handler
        self.user_id, self.scopes, self.anonymous = user_id, scopes, anonymous

    def __call__(self, method: str, path: str, body=None, headers: dict | None = None, raw: str | None = None):
        text = raw if raw is not None else (json.dumps(body) if body is not None else None)
        path, _, query = path.partition("?")
        caller = None if self.anonymous else caller_context(self.user_id, self.scopes)
        response = self.handler(events.api_gateway_proxy(method, path, text, headers, query, authorizer=caller),
                                events.LambdaContext("ApiFunction"))
        return response["statusCode"], events.json_body(response) if response["body"].startswith(("{", "[")) else response["body"]

    def account(self, name: str | None = None, balance: str | None = None, **fields) -> int:
        status, body = self("POST", "/accounts", {"user_name": name or f"u-{uuid.uuid4().hex[:12]}", **fields})
        assert status == 201, body
        user_id = body["user_id"]
        if balance:
            status, body = self("POST", f"/accounts/{user_id}/recharge", {"amount": balance})
            assert status == 200, body
        return user_id


def invoke_writer(records: list[tuple[int, int, bytes | None, bytes | None]], topic: str | None = None) -> dict:
    """The writer function with an MSK event holding these (partition, offset, key, value) records."""
    from writer.app import handler

    topic = topic or os.environ["KAFKA_TOPIC"]
    event = events.msk(topic, [(p, o, k, v, 1_700_000_000_000) for p, o, k, v in records])
    return handler(event, events.LambdaContext("WriterFunction"))


def broker_records(topic: str | None = None) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every record the broker's log holds for the topic, with its real partition and offset, in log order per
    partition: what an MSK event source delivers to the writer."""
    from confluent_kafka import Consumer, TopicPartition

    topic = topic or os.environ["KAFKA_TOPIC"]
    reader = Consumer({"bootstrap.servers": os.environ["KAFKA_BOOTSTRAP"], "group.id": f"test-reader-{uuid.uuid4().hex}",
                       "enable.auto.commit": False})
    try:
        ends = {p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                for p in reader.list_topics(topic, timeout=10).topics[topic].partitions}
        reader.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
        found = []
        deadline = time.monotonic() + 30
        while len(found) < sum(ends.values()) and time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is not None and message.error() is None:
                found.append((message.partition(), message.offset(), message.key(), message.value()))
        return sorted(found)
    finally:
        reader.close()


def lift_rebuild_hold(redis_client, hash_key: str, log_too: bool = True) -> None:
    """A rebuilt voucher or red packet as REBUILD_HOLD_S after its rebuild: the time hold over (log_too: and its
    log hold lifted, as if the writer had caught up)."""
    redis_client.hset(hash_key, "hold_until", 0)
    if log_too:
        redis_client.hdel(hash_key, "hold_log")


def records(events_, key_of, partition: int = 0, first_offset: int = 0) -> list[tuple[int, int, bytes, bytes]]:
    """Events as the broker holds them, signed as the service signs them: (partition, offset, key, JSON value)."""
    return [(partition, first_offset + i, key_of(e).encode(), signed_value(e.model_dump()))
            for i, e in enumerate(events_)]


@contextlib.contextmanager
def moto_secrets(monkeypatch):
    """Secrets Manager in moto (in process), with Powertools' parameter cache empty before and after: yields a client."""
    import boto3
    from aws_lambda_powertools.utilities import parameters
    from moto import mock_aws

    for name, value in (("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_ACCESS_KEY_ID", "testing"),
                        ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        parameters.clear_caches()
        try:
            yield boto3.client("secretsmanager")
        finally:
            parameters.clear_caches()


def run_event_keys():
    """The run's keyring (EVENT_KEYS, set by conftest), as the functions read it."""
    from hotledger.dal.event_keys import EventKeys

    return EventKeys(None, os.environ["EVENT_KEYS"], 0)


def verified_fields(event: dict) -> dict:
    """A published event's fields, once its signature passed the writer's check (decode)."""
    from hotledger.outbox.events import RawRecord, decode

    from hotledger.dal.event_keys import record_value

    events_, poison = decode([RawRecord("t", 0, 0, None, record_value(event))], run_event_keys())
    assert not poison, poison
    return events_[0].model_dump(exclude_unset=True)


def signed_value(event: dict) -> bytes:
    """An event's record value as the service publishes it: signed with the run's current key (a `kid` and `mac` it
    carries, say from a record changed for a test, are replaced)."""
    from hotledger.dal.event_keys import record_value
    from hotledger.outbox.events import EVENT_ADAPTER, signed

    return record_value(signed(EVENT_ADAPTER.validate_python(event).model_dump(), run_event_keys().keyring()))


def ledger_records(redis_client, user_ids, first_offset: int = 0):
    """The ledger events the API published for these accounts, rebuilt from Redis (per account in version order)."""
    from hotledger.ledger.store import pending_entries

    entries = sorted((e for u in user_ids for e in pending_entries(redis_client, u)), key=lambda e: (e.user_id, e.version))
    return records([e.to_event() for e in entries], lambda e: str(e.user_id), first_offset=first_offset)


def reconcile(monkeypatch=None, age_s: int | None = None) -> dict:
    """One scheduled run of the reconciler function; with age_s, entries older than that count as stale."""
    from reconciler.app import handler

    from hotledger.runtime import reconciler

    if age_s is not None:
        monkeypatch.setattr(reconciler(), "age_s", age_s)
    return handler(events.scheduled(), events.LambdaContext("ReconcilerFunction"))


def reconcile_pass(monkeypatch=None, age_s: int | None = None) -> list[dict]:
    """Reconciler runs until each part (accounts, vouchers, packets) went over all of its entities from the first,
    since this call: a run stops where its budget (items or seconds) ran out and the next goes on from there, and the
    suite leaves many entities behind, so one run may not reach a test's own. A part first finishes the pass an
    earlier run left open, then makes one whole pass. Returns the reports of the runs."""
    parts = {"accounts": lambda r: r["next_after"], "vouchers": lambda r: r["vouchers"]["next_after"],
             "packets": lambda r: r["packets"]["next_after"], "reminders": lambda r: r["reminders_next_after"]}
    ends_seen = dict.fromkeys(parts, 0)  # 2: the open pass finished, then a whole one
    reports = []
    while min(ends_seen.values()) < 2:
        reports.append(reconcile(monkeypatch, age_s))
        for part, next_after in parts.items():
            ends_seen[part] += not next_after(reports[-1])
    return reports


def reconcile_totals(monkeypatch=None, age_s: int | None = None) -> dict:
    """reconcile_pass, its reports summed (each count over the whole pass, whatever each run's budget covered)."""
    def add(totals: dict, report: dict) -> dict:
        for name, value in report.items():
            if isinstance(value, dict):  # a part's own report (vouchers, packets, journeys)
                add(totals.setdefault(name, {}), value)
            elif isinstance(value, float):  # an age: the oldest seen
                totals[name] = max(totals.get(name, value), value)
            elif isinstance(value, int) and not isinstance(value, bool) and not name.endswith("next_after"):
                totals[name] = totals.get(name, 0) + value
        return totals

    totals: dict = {}
    for report in reconcile_pass(monkeypatch, age_s):
        add(totals, report)
    return totals


class LocalService:
    def __init__(self, port: int, env: dict, log_path: Path, args: tuple[str, ...] = ()):
        self.port, self.log_path = port, log_path
        self.base = f"http://127.0.0.1:{port}"
        self.env = {**os.environ, **env}
        self.args = args
        self.proc: subprocess.Popen | None = None

    def start(self, wait_http: bool = True) -> LocalService:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infra.localrt.runtime", "--port", str(self.port), *self.args],
            cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        if wait_http and "--no-api" not in self.args:
            self.wait_until(lambda: self.request("GET", "/openapi.json")[0] == 200, 30, "HTTP port")
        return self

    def kill(self) -> None:
        """SIGKILL the whole process group: API workers, consumer and scheduler die mid-flight."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def request(self, method: str, path: str, body=None, headers: dict | None = None, timeout: float = 30, token=TRUSTED):
        """token: a bearer token, None for none; by default the trusted backend's."""
        data = json.dumps(body).encode() if body is not None else None
        bearer = {} if token is None else {"Authorization": f"Bearer {token_for() if token is TRUSTED else token}"}
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **bearer, **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, None

    @staticmethod
    def wait_until(predicate, timeout_s: float, what: str, interval: float = 0.2):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def voucher(api, stock=5, begin_at=None, end_at=None, **fields) -> int:
    """A voucher created through POST /vouchers (on sale from a second ago for an hour unless told); its id."""
    now = int(time.time() * 1000)
    status, body = api("POST", "/vouchers", {"title": "10 off", "stock": stock, "begin_at": begin_at or now - 1000,
                                             "end_at": end_at or now + 3_600_000, **fields})
    assert status == 201, body
    return int(body["voucher_id"])


class Receiver:
    """A local webhook endpoint (tests of webhooks and balance monitors): records what it got; answers `status`."""

    def __init__(self, status: int = 204):
        self.status, self.got = status, []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"])).decode()
                receiver.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self, secret: str) -> list[dict]:
        """Every delivery verified as a receiver would (a 5-minute tolerance), parsed."""
        from standardwebhooks import Webhook

        return [Webhook(secret).verify(body, headers) for headers, body in self.got]

    def close(self):
        self.server.shutdown()
