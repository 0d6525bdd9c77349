"""API events: HTTP on the runtime's port turned into the events of the front door (template.yaml, FrontDoor): REST
proxy events behind the API's Lambda authorizer, or HTTP API payload v2 events behind its JWT authorizer, each run
first as API Gateway runs it (gateway.py); each worker process handles one request at a time like Lambda."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
from http.server import BaseHTTPRequestHandler, HTTPServer

from infra.localrt import events, gateway, template
from infra.localrt.handlers import load_handler

log = logging.getLogger("localrt")


def _api_request_handler(fn: template.Function, handler, gate: gateway.Gate | gateway.JwtGate | None):
    api_key = os.environ.get("HOTLEDGER_API_KEY") or None

    class ApiGatewayProxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection: no worker is pinned by keep-alive

        def _invoke(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items()}
            path, _, query = self.path.partition("?")
            caller = gate.admit(self.command, path, headers) if gate is not None else None
            if isinstance(caller, gateway.Refused):
                return self._send(caller.status, {"Content-Type": "application/json"}, caller.body)
            if api_key is not None and self.headers.get("x-api-key") != api_key:
                return self._send(403, {"Content-Type": "application/json"}, json.dumps({"message": "Forbidden"}))
            if isinstance(gate, gateway.JwtGate):
                event = events.api_gateway_http(self.command, path, body, headers, query, jwt=caller)
            else:
                event = events.api_gateway_proxy(self.command, path, body, headers, query, authorizer=caller)
            try:
                result = handler(event, events.LambdaContext(fn.name, fn.timeout_s))
            except Exception:  # Lambda answers 502 when the function itself crashes
                log.exception("function %s failed", fn.name)
                return self._send(
                    502, {"Content-Type": "application/json"}, json.dumps({"message": "Internal server error"})
                )
            out_headers = dict(result.get("headers") or {})
            for name, values in (result.get("multiValueHeaders") or {}).items():
                out_headers[name] = ", ".join(values)
            self._send(result.get("statusCode", 200), out_headers, result.get("body") or "")

        def _send(self, status: int, headers: dict, body: str):
            data = body.encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = do_OPTIONS = do_HEAD = _invoke

        def _no_such_method(self):
            # Method ANY covers the seven above; API Gateway answers any other (TRACE, CONNECT, PROPFIND...) like an
            # unknown resource: 403 {"message": "Missing Authentication Token"}, the function is not invoked
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            self._send(
                403,
                {"Content-Type": "application/json", "x-amzn-ErrorType": "MissingAuthenticationTokenException"},
                json.dumps({"message": "Missing Authentication Token"}),
            )

        def __getattr__(self, name: str):
            if name.startswith("do_"):  # http.server would answer 501 for a method without a do_ handler
                return self._no_such_method
            raise AttributeError(name)

        def log_message(self, fmt, *args):  # handlers log structured JSON themselves
            pass

    return ApiGatewayProxy


def _gate(fn: template.Function, authorizer: template.ApiAuthorizer | None, functions: list[template.Function]):
    if os.environ.get("HOTLEDGER_FRONT_DOOR") == "http":
        audience = {c.strip() for c in os.environ["AUTH_CLIENT_IDS"].split(",") if c.strip()}
        return gateway.JwtGate(os.environ["AUTH_ISSUER"], os.environ["AUTH_JWKS_URL"], audience, fn.public_routes)
    if authorizer is None:
        return None
    authorizer_fn = next(f for f in functions if f.name == authorizer.function)
    return gateway.Gate(
        authorizer,
        load_handler(authorizer_fn),
        fn.public_routes,
        lambda: events.LambdaContext(authorizer_fn.name, authorizer_fn.timeout_s),
    )


def start_api_workers(
    fn: template.Function,
    host: str,
    port: int,
    workers: int,
    authorizer: template.ApiAuthorizer | None,
    functions: list[template.Function],
) -> list[int]:
    listener = socket.create_server((host, port), backlog=1024, reuse_port=False)
    pids = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            handler = _api_request_handler(fn, load_handler(fn), _gate(fn, authorizer, functions))
            server = HTTPServer((host, port), handler, bind_and_activate=False)
            server.socket.close()
            server.socket = listener
            try:
                server.serve_forever(poll_interval=0.5)
            finally:
                os._exit(0)
        pids.append(pid)
    listener.close()
    return pids
