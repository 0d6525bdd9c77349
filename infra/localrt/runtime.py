"""Local stand-in for `sam local start-api` plus the MSK and schedule triggers, without Docker.

It reads template.yaml and runs the very same handlers:
- API events: HTTP on --port (3000) turned into the front door's events (the template's FrontDoor default, or
  HOTLEDGER_FRONT_DOOR): HTTP API payload 2.0 events behind its JWT authorizer, or REST proxy events behind the REST
  API's Lambda authorizer, each run before the request as API Gateway runs it (infra/localrt/gateway.py). Like
  Lambda, each worker process handles one request at a time; --api-workers processes share the socket.
  Tokens are checked against the local dev issuer (infra/dev_issuer.py: `make token`) unless AUTH_ISSUER /
  AUTH_JWKS_URL / AUTH_CLIENT_IDS name another issuer (a Cognito user pool, say).
  With HOTLEDGER_API_KEY set, requests need a matching x-api-key header (as API Gateway enforces).
- MSK events: a Kafka consumer group delivers MSK-shaped batches (BatchSize and
  MaximumBatchingWindowInSeconds from the template); offsets are committed only once each record was
  handled or handed to the on-failure destination, under the template's error contract (MaximumRetryAttempts,
  MaximumRecordAgeInSeconds, BisectBatchOnFunctionError, ReportBatchItemFailures, kafka:// destination):
  see MskPoller._deliver.
- Schedule events: invoked at their rate, or every HOTLEDGER_LOCAL_SCHEDULE_RATE_S seconds (the Redis
  Streams drainer among them: each run drains until shortly before its timeout).
Layers are "mounted" by pointing LUA_DIR at the layer's ContentUri. One module each: api_workers.py, msk.py,
scheduler.py (handlers.py: what they share); this one reads the template and starts them.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from infra import dev_issuer
from infra.event_keys import local_keyring
from infra.localrt import template
from infra.localrt.api_workers import start_api_workers
from infra.localrt.handlers import note_signals
from infra.localrt.msk import start_msk_trigger
from infra.localrt.scheduler import Scheduler

REPO = Path(__file__).resolve().parents[2]
log = logging.getLogger("localrt")


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
    if not (os.environ.get("EVENT_KEYS") or os.environ.get("EVENT_KEYS_SECRET_ARN")):
        os.environ["EVENT_KEYS"] = local_keyring()  # the dev keyring in .state/, as the stack's secret is in AWS
    os.environ.setdefault("WEBHOOK_ALLOW_LOCAL", "1")  # local receivers (http://127.0.0.1) may be webhook endpoints
    door = template.front_door(Path(args.template))
    authorizer = template.api_authorizer(Path(args.template)) if door == "rest" else None
    issuer = None
    if any(fn.api for fn in functions) and not args.no_api and "AUTH_ISSUER" not in os.environ:
        issuer = dev_issuer.JwksServer()  # bound now: the workers forked below inherit its URL
        os.environ.update(issuer.authorizer_env())
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    schedule_override = os.environ.get("HOTLEDGER_LOCAL_SCHEDULE_RATE_S")
    stop = threading.Event()
    children: list[int] = []
    # fork the API workers and the MSK pollers before any thread exists in this process
    for fn in functions:
        if fn.api and not args.no_api:
            children += start_api_workers(fn, args.host, args.port, args.api_workers, door, authorizer, functions)
            log.info(
                "%s: http://%s:%d (%d workers, FrontDoor %s)", fn.name, args.host, args.port, args.api_workers, door
            )
    for fn in functions:
        # with the Redis Streams transport nothing goes to Kafka: the scheduled drainer persists (as in AWS,
        # where the template then creates no MSK trigger)
        if fn.msk and not args.no_msk and os.environ.get("EVENT_TRANSPORT", "kafka") == "kafka":
            topic = os.environ.get("KAFKA_TOPIC", fn.msk["topic"])  # like --parameter-overrides KafkaTopic=...
            if topic != fn.msk["topic"]:
                # a group of its own per topic, as each stack's mapping has: runtimes of other topics on the same broker
                # (test stacks, benchmarks) neither share its offsets nor hold members in it (a group with members
                # refuses the commits of consumers assigned their partitions)
                # and its dead-letter topic follows it, as the template's ${KafkaTopic}.dead-letter does
                fn.msk.update(
                    topic=topic,
                    group_id=f"{fn.msk['group_id']}.{topic}",
                    dead_letter_topic=fn.msk["dead_letter_topic"] and f"{topic}.dead-letter",
                )
            children.append(start_msk_trigger(fn, bootstrap))
    if issuer is not None:
        issuer.serve_in_thread()
        log.info("local dev issuer %s: tokens with `make token`", dev_issuer.ISSUER)
    threads: list[threading.Thread] = []
    if not args.no_schedules:
        for fn in functions:
            for rate in fn.schedules:
                every = float(schedule_override) if schedule_override else rate
                threads.append(Scheduler(fn, every, stop))
                log.info("%s: every %.1fs", fn.name, every)
    for thread in threads:
        thread.start()

    signalled = note_signals()
    try:
        while not signalled:
            time.sleep(0.2)
            for pid in children:
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    log.error("child process %d exited; stopping", pid)
                    signalled.append(signal.SIGTERM)
    finally:
        stop.set()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    return 0


if __name__ == "__main__":
    sys.exit(main())
