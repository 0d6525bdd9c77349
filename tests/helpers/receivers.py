"""A local webhook receiver (a real HTTP server) for the webhook and balance-monitor tests."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer


class Receiver:
    """A local webhook endpoint (tests of webhooks and balance monitors): records what it got; answers `status`.
    With `hold`, it answers each request only once that event is set (a hanging endpoint); with `delay_s`, that much
    later (a slow one); down() makes nothing listen on its port (connections refused) until up(). With `answer`, the
    status is answer(event) for each event (the body parsed) instead."""

    def __init__(self, status: int = 204, hold: threading.Event | None = None):
        self.status, self.got, self.hold, self.delay_s = status, [], hold, 0.0
        self.headers: dict[str, str] = {}  # sent with every answer (a 429's Retry-After)
        self.answer: Callable[[dict], int] | None = None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"])).decode()
                receiver.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                if receiver.hold is not None:
                    receiver.hold.wait(60)
                time.sleep(receiver.delay_s)
                self.send_response(receiver.answer(json.loads(body)) if receiver.answer else receiver.status)
                for name, value in receiver.headers.items():
                    self.send_header(name, value)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.handler = Handler
        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        self.url = f"http://127.0.0.1:{self.port}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def up(self) -> None:
        self.server = HTTPServer(("127.0.0.1", self.port), self.handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self, secret: str) -> list[dict]:
        """Every delivery verified as a receiver would (a 5-minute tolerance), parsed."""
        from standardwebhooks import Webhook

        return [Webhook(secret).verify(body, headers) for headers, body in self.got]

    def close(self):
        if self.hold is not None:
            self.hold.set()
        self.server.shutdown()


class RawReceiver:
    """A TCP server on 127.0.0.1 that reads a request's head and answers `reply` as is (garbage, for a receiver that
    does not speak HTTP); counts the connections it accepted. RawReceiver(None): a blackhole, it listens but never
    accepts (the kernel completes the handshake; the request is never answered)."""

    def __init__(self, reply: bytes | None):
        self.reply, self.accepted = reply, 0
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks"
        if reply is not None:
            threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn, contextlib.suppress(OSError):
                conn.settimeout(5)
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    head += chunk
                conn.sendall(self.reply)

    def close(self):
        self.sock.close()
