"""Local stand-in for `sam local start-api` plus the MSK and schedule triggers, without Docker.

It reads template.yaml and runs the very same handlers:
- API events: HTTP on --port (3000) turned into API Gateway REST proxy events. Like Lambda, each
  worker process handles one request at a time; --api-workers processes share the socket.
  With HOTLEDGER_API_KEY set, requests need a matching x-api-key header (as API Gateway enforces).
- MSK events: a Kafka consumer group delivers MSK-shaped batches (BatchSize and
  MaximumBatchingWindowInSeconds from the template); offsets are committed only after the function
  succeeded; an exception retries the whole batch, batchItemFailures retries from the first failed
  offset of each partition (the Lambda contract).
- Schedule events: invoked at their rate, or every HOTLEDGER_LOCAL_SCHEDULE_RATE_S seconds (the Redis
  Streams drainer among them: each run drains until shortly before its timeout).
Layers are "mounted" by pointing LUA_DIR at the layer's ContentUri.
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from infra.localrt import events, template

REPO = Path(__file__).resolve().parents[2]
log = logging.getLogger("localrt")


def _load_handler(fn: template.Function):
    if str(fn.code_dir) not in sys.path:
        sys.path.insert(0, str(fn.code_dir))
    if fn.layer_dirs:
        os.environ.setdefault("LUA_DIR", str(fn.layer_dirs[0]))
    module, attr = fn.handler.rsplit(".", 1)
    return getattr(importlib.import_module(module), attr)


# API ------------------------------------------------------------------------------------------------
def _api_request_handler(fn: template.Function, handler):
    api_key = os.environ.get("HOTLEDGER_API_KEY") or None

    class ApiGatewayProxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection: no worker is pinned by keep-alive

        def _invoke(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items()}
            if api_key is not None and self.headers.get("x-api-key") != api_key:
                return self._send(403, {"Content-Type": "application/json"}, json.dumps({"message": "Forbidden"}))
            path, _, query = self.path.partition("?")
            event = events.api_gateway_proxy(self.command, path, body, headers, query)
            try:
                result = handler(event, events.LambdaContext(fn.name, fn.timeout_s))
            except Exception:  # Lambda answers 502 when the function itself crashes
                log.exception("function %s failed", fn.name)
                return self._send(502, {"Content-Type": "application/json"}, json.dumps({"message": "Internal server error"}))
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
            self._send(403, {"Content-Type": "application/json", "x-amzn-ErrorType": "MissingAuthenticationTokenException"},
                       json.dumps({"message": "Missing Authentication Token"}))

        def __getattr__(self, name: str):
            if name.startswith("do_"):  # http.server would answer 501 for a method without a do_ handler
                return self._no_such_method
            raise AttributeError(name)

        def log_message(self, fmt, *args):  # handlers log structured JSON themselves
            pass

    return ApiGatewayProxy


def start_api_workers(fn: template.Function, host: str, port: int, workers: int) -> list[int]:
    listener = socket.create_server((host, port), backlog=1024, reuse_port=False)
    pids = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            server = HTTPServer((host, port), _api_request_handler(fn, _load_handler(fn)), bind_and_activate=False)
            server.socket.close()
            server.socket = listener
            try:
                server.serve_forever(poll_interval=0.5)
            finally:
                os._exit(0)
        pids.append(pid)
    listener.close()
    return pids


# MSK ------------------------------------------------------------------------------------------------
class MskPoller(threading.Thread):
    def __init__(self, fn: template.Function, bootstrap: str, stop: threading.Event):
        super().__init__(name=f"msk-{fn.name}", daemon=True)
        self.fn, self.bootstrap, self.stop_event = fn, bootstrap, stop
        self.handler = _load_handler(fn)  # imported here, in the main thread: see Scheduler
        self.commit_delay_s = float(os.environ.get("HOTLEDGER_LOCAL_COMMIT_DELAY_S", "0"))

    def run(self):
        backoff = 0.5
        while not self.stop_event.is_set():
            consumer = None
            try:
                consumer = self._consumer()
                while not self.stop_event.is_set():
                    backoff = self._poll_once(consumer, self.handler, backoff)
            except Exception:  # broker gone or group lost: like the event source mapping, reconnect and go on
                log.exception("consumer for %s failed; reconnecting", self.fn.name)
                time.sleep(2)
            finally:
                if consumer is not None:
                    consumer.close(autocommit=False)

    def _consumer(self):
        from kafka import KafkaConsumer

        cfg = self.fn.msk
        return KafkaConsumer(
            cfg["topic"], bootstrap_servers=self.bootstrap.split(","), group_id=cfg["group_id"],
            enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=cfg["batch_size"],
            session_timeout_ms=6000, heartbeat_interval_ms=2000, max_poll_interval_ms=120000, fetch_max_wait_ms=100,
            security_protocol=os.environ.get("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT"),
        )

    def _poll_once(self, consumer, handler, backoff: float) -> float:
        """Deliver one batch; commit what succeeded, rewind to the first failure. Returns the next backoff."""
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        cfg = self.fn.msk
        batch = self._collect(consumer, cfg)
        if not batch:
            return backoff
        failed = self._invoke(handler, cfg["topic"], batch)
        first_failed: dict = {}
        for record in batch:
            tp = TopicPartition(record.topic, record.partition)
            if (record.partition, record.offset) in failed and tp not in first_failed:
                first_failed[tp] = record.offset
        commit = {}
        for record in batch:
            tp = TopicPartition(record.topic, record.partition)
            if tp not in first_failed or record.offset < first_failed[tp]:
                commit[tp] = OffsetAndMetadata(record.offset + 1, "", -1)
        if commit:
            log.info("batch of %d handled; committing %s", len(batch), {f"{t.topic}-{t.partition}": o.offset for t, o in commit.items()})
            time.sleep(self.commit_delay_s)
            consumer.commit(commit)
        for tp, offset in first_failed.items():
            consumer.seek(tp, offset)
        if not first_failed:
            return 0.5
        time.sleep(backoff)
        return min(backoff * 2, 5.0)

    @staticmethod
    def _collect(consumer, cfg) -> list:
        batch, deadline = [], time.monotonic() + max(cfg["window_s"], 0.05)
        while len(batch) < cfg["batch_size"]:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 and batch:
                break
            polled = consumer.poll(timeout_ms=max(remaining_ms, 200 if not batch else 0), max_records=cfg["batch_size"] - len(batch))
            for records in polled.values():
                batch.extend(records)
            if not polled and time.monotonic() >= deadline:
                break
        return batch

    def _invoke(self, handler, topic: str, batch: list) -> set:
        event = events.msk(topic, [(r.partition, r.offset, r.key, r.value, r.timestamp) for r in batch], bootstrap=self.bootstrap)
        try:
            response = handler(event, events.LambdaContext(self.fn.name, self.fn.timeout_s))
        except Exception:
            log.exception("function %s failed; the batch will be retried", self.fn.name)
            return {(r.partition, r.offset) for r in batch}
        failures = (response or {}).get("batchItemFailures") or []
        return {(int(f["itemIdentifier"]["partition"].rsplit("-", 1)[1]), int(f["itemIdentifier"]["offset"])) for f in failures}


# schedules ------------------------------------------------------------------------------------------
class Scheduler(threading.Thread):
    def __init__(self, fn: template.Function, every_s: float, stop: threading.Event):
        super().__init__(name=f"schedule-{fn.name}", daemon=True)
        self.fn, self.every_s, self.stop_event = fn, every_s, stop
        # handler modules are imported one after another in the main thread: Powertools Loggers of one
        # service created by threads at once can leave the shared logger without a formatter for good
        self.handler = _load_handler(fn)

    def run(self):
        while not self.stop_event.wait(self.every_s):
            try:
                self.handler(events.scheduled(), events.LambdaContext(self.fn.name, self.fn.timeout_s))
            except Exception:
                log.exception("scheduled function %s failed", self.fn.name)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", default=str(REPO / "template.yaml"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3000)
    parser.add_argument("--api-workers", type=int, default=int(os.environ.get("HOTLEDGER_API_WORKERS", "4")))
    parser.add_argument("--no-api", action="store_true")
    parser.add_argument("--no-msk", action="store_true")
    parser.add_argument("--no-schedules", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s localrt %(levelname)s %(message)s", stream=sys.stderr)

    functions = template.load(Path(args.template))
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    schedule_override = os.environ.get("HOTLEDGER_LOCAL_SCHEDULE_RATE_S")
    stop = threading.Event()
    children: list[int] = []
    # fork the API workers before any thread exists in this process
    for fn in functions:
        if fn.api and not args.no_api:
            children += start_api_workers(fn, args.host, args.port, args.api_workers)
            log.info("%s: http://%s:%d (%d workers)", fn.name, args.host, args.port, args.api_workers)
    threads: list[threading.Thread] = []
    for fn in functions:
        # with the Redis Streams transport nothing goes to Kafka: the scheduled drainer persists (as in AWS,
        # where the template then creates no MSK trigger)
        if fn.msk and not args.no_msk and os.environ.get("EVENT_TRANSPORT", "kafka") == "kafka":
            fn.msk["topic"] = os.environ.get("KAFKA_TOPIC", fn.msk["topic"])  # like --parameter-overrides KafkaTopic=...
            threads.append(MskPoller(fn, bootstrap, stop))
            log.info("%s: MSK topic %s, batch %d, window %.1fs", fn.name, fn.msk["topic"], fn.msk["batch_size"], fn.msk["window_s"])
        if not args.no_schedules:
            for rate in fn.schedules:
                every = float(schedule_override) if schedule_override else rate
                threads.append(Scheduler(fn, every, stop))
                log.info("%s: every %.1fs", fn.name, every)
    for thread in threads:
        thread.start()

    def shutdown(*_):
        stop.set()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    try:
        while not stop.wait(1.0):
            for pid in children:
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    log.error("API worker %d exited; stopping", pid)
                    stop.set()
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
