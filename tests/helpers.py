"""What the tests share: driving the handlers with real event shapes (Api, invoke_writer, reconcile), rebuilding
the records the broker holds from Redis, and the local runtime as a real child process spoken to over HTTP."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from infra.localrt import events

REPO = Path(__file__).resolve().parents[1]
EVENTS = REPO / "events"


class Api:
    """Calls the API function's handler with API Gateway REST proxy events."""

    def __init__(self):
        from api.app import handler

        self.handler = handler

    def __call__(self, method: str, path: str, body=None, headers: dict | None = None, raw: str | None = None):
        text = raw if raw is not None else (json.dumps(body) if body is not None else None)
        path, _, query = path.partition("?")
        response = self.handler(events.api_gateway_proxy(method, path, text, headers, query), events.LambdaContext("ApiFunction"))
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


def records(events_, key_of, partition: int = 0, first_offset: int = 0) -> list[tuple[int, int, bytes, bytes]]:
    """Events as the broker holds them: (partition, offset, key, JSON value)."""
    return [(partition, first_offset + i, key_of(e).encode(), e.model_dump_json().encode()) for i, e in enumerate(events_)]


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

    def request(self, method: str, path: str, body=None, headers: dict | None = None, timeout: float = 30):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
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
