"""The local runtime as a real child process, spoken to over HTTP, killed and restarted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from helpers import REPO
from helpers.callers import TRUSTED, token_for


class LocalService:
    def __init__(self, port: int, env: dict, log_path: Path, args: tuple[str, ...] = ()):
        self.port, self.log_path = port, log_path
        self.base = f"http://127.0.0.1:{port}"
        self.env = {**os.environ, **env}
        self.args = args
        self.proc: subprocess.Popen | None = None

    def start(self, wait_http: bool = True) -> LocalService:
        with open(self.log_path, "ab") as log:  # the runtime writes to its own copy of the descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "infra.localrt.runtime", "--port", str(self.port), *self.args],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
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

    def request(
        self, method: str, path: str, body=None, headers: dict | None = None, timeout: float = 30, token=TRUSTED
    ):
        """token: a bearer token, None for none; by default the trusted backend's."""
        data = json.dumps(body).encode() if body is not None else None
        bearer = {} if token is None else {"Authorization": f"Bearer {token_for() if token is TRUSTED else token}"}
        req = urllib.request.Request(
            self.base + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", **bearer, **(headers or {})},
        )
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
