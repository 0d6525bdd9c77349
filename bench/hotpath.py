"""The lean hot path: CPU per warm ASYNC deduct through the API handler against a floor measured in the same run.

handler: the Lambda handler (api.app.handler) with an API Gateway REST proxy event, in process, one request at a
time, as one Lambda container runs it at the template's settings (the API function's LOG_LEVEL and Powertools
variables from template.yaml, the X-Ray tracer on as `Tracing: Active` turns it on in Lambda, a trace header per
invocation sampled as X-Ray's default rule samples a busy function: one in 20): the runtime's json.loads of the
event, the handler, json.dumps of its answer.
floor: only the work no handler can skip: json.loads of the same event and its body, the same EVALSHA of
ledger_apply through redis-py (same KEYS/ARGV), the event signed (canonical JSON once, its HMAC-SHA256 with a key
parsed before the loop) and produced in the writer's layout, waiting for the broker's ack, json.dumps of an answer
of the same shape.
Both count time.process_time(): the CPU of every thread of this process (librdkafka's too), not the broker's or
Redis's. Each measurement runs in a fresh process (a Lambda container's imports under its settings), with hiredis
(redis-py's C parser, when installed: the Lambda layer ships it) and without it.

handler_breakdown_us: where the handler's CPU per deduct goes, from a sampling profiler (the main thread's stack
every SAMPLE_EVERY_S of process CPU, each sample named by the innermost frame of a known part), scaled to
handler_cpu_us_per_deduct.
handler_vs_floor_cpu_ratio_without_log_and_emf_lines: the ratio with the charge's INFO line and the invocation's EMF
line switched off in the running handler, the lowest that leaner observability could bring it to (a line timed alone
in a loop costs a fraction of what it costs in the handler, so only switching it off in place tells).
handler_instructions_per_deduct, floor_instructions_per_deduct and handler_vs_floor_instructions_ratio: the same loops
counted in instructions by valgrind (and the handler's without its log and EMF lines, and the ledger service's alone:
where the handler's extra work is) (cachegrind without its cache simulation), each in a fresh process at the same
settings, less a process doing only the setup. CPU time swings with the machine's load by tens of percent between
runs; an instruction count does not, so it shows what a change to the handler's work did, to about a percent. It
counts the user-space instructions of every thread (not the kernel's side of a write or a send).

    PYTHONPATH=functions:. .venv/bin/python bench/hotpath.py [--quick] [--profile N]
(`make bench` runs it as part of bench/run.py; alone it starts the same servers and prints the figures.)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "functions"), str(REPO), str(REPO / "bench")]

BALANCE = "90000000000.00"
WARM_UP = 300
SAMPLED_ONE_IN = 20  # X-Ray's default sampling rule: the first request each second, then 5%
SAMPLE_EVERY_S = 0.0005


def production_env(template_path: Path = REPO / "template.yaml", function: str = "ApiFunction") -> dict[str, str]:
    """What changes the handler's own work in the API function's settings, as template.yaml gives them: the log
    level and the Powertools variables (Globals, then the function's own), and, with `Tracing: Active`, what the
    Lambda service sets so the X-Ray SDK and Powertools' Tracer run (they switch themselves off outside Lambda)."""
    from infra.localrt import template

    loaded = template._read(template_path)
    globals_fn = loaded.get("Globals", {}).get("Function", {})
    own = loaded["Resources"][function]["Properties"]
    variables = {
        **globals_fn.get("Environment", {}).get("Variables", {}),
        **own.get("Environment", {}).get("Variables", {}),
    }
    env = {
        name: str(template._value(loaded, value))
        for name, value in variables.items()
        if name == "LOG_LEVEL" or name.startswith("POWERTOOLS_")
    }
    if template._value(loaded, own.get("Tracing", globals_fn.get("Tracing"))) == "Active":
        env.update(
            {
                "LAMBDA_TASK_ROOT": "/var/task",
                "AWS_LAMBDA_FUNCTION_NAME": function,
                "AWS_XRAY_DAEMON_ADDRESS": "127.0.0.1:2000",
            }
        )  # UDP, as in Lambda; nothing listens here
    return env


def _trace_header(n: int) -> str:
    """The trace header the Lambda runtime sets for invocation n (_X_AMZN_TRACE_ID)."""
    sampled = 1 if n % SAMPLED_ONE_IN == 0 else 0
    return f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]};Parent={uuid.uuid4().hex[:16]};Sampled={sampled}"


def _deduct_events(user_id: int, n: int, amount: str = "0.01", route: str = "deduct") -> list[tuple[str, str]]:
    """The invocation payloads as the Lambda runtime receives them (JSON text) with their trace headers, built
    before the clock starts."""
    from infra import dev_issuer
    from infra.localrt import events

    backend = dev_issuer.caller_context(None, ("service",))  # what the authorizer passes for the backend's token
    return [
        (
            json.dumps(
                events.api_gateway_proxy(
                    "POST",
                    f"/accounts/{user_id}/{route}",
                    json.dumps({"amount": amount}),
                    {"Content-Type": "application/json"},
                    authorizer=backend,
                )
            ),
            _trace_header(i),
        )
        for i in range(n)
    ]


def _hot_account(call) -> int:
    status, body = call("POST", "/accounts", {"user_name": f"hotpath-{uuid.uuid4().hex[:8]}"})
    user_id = body["user_id"]
    assert call("POST", f"/accounts/{user_id}/recharge", {"amount": BALANCE})[0] == 200
    return user_id


def handler_loop(payloads: list[tuple[str, str]]) -> float:
    """CPU seconds for invoking the handler once per payload, as the runtime does (its trace header set first)."""
    from api.app import handler
    from infra.localrt import events

    context = events.LambdaContext("ApiFunction")
    environ = os.environ
    started = time.process_time()
    for payload, trace_header in payloads:
        environ["_X_AMZN_TRACE_ID"] = trace_header
        response = handler(json.loads(payload), context)
        json.dumps(response)
    spent = time.process_time() - started
    assert response["statusCode"] == 200, response
    return spent


def _answer_json(entry_id: int, user_id: int, balance: object, version: int, mode: str) -> str:
    """The JSON of an answer of the deduct's shape, as the runtime serializes the handler's (its body serialized
    first)."""
    body = {
        "order_id": str(entry_id),
        "user_id": user_id,
        "amount": "0.01",
        "balance": str(balance),
        "version": version,
        "mode": mode,
    }
    return json.dumps({"statusCode": 200, "headers": {"Content-Type": "application/json"}, "body": json.dumps(body)})


def floor_loop(user_id: int, payloads: list[tuple[str, str]]) -> float:
    """CPU seconds for the bare work of the same deducts: parse, EVALSHA, sign, produce + ack, serialize."""
    import hashlib
    import hmac

    from hotledger import keys
    from hotledger.config import settings
    from hotledger.dal.event_keys import canonical
    from hotledger.dal.publisher import publish
    from hotledger.dal.redis_store import lua as runner
    from hotledger.ledger.rows import MAX_BALANCE
    from hotledger.runtime import event_keys

    cfg = settings()
    stale_ms = int(cfg.publish_timeout_s * 2000) + 5000
    lua = runner()
    client, sha = lua.client, lua.sha("ledger_apply")
    keyring = event_keys().keyring()
    kid = canonical(keyring.kid)
    balance, pending = keys.balance(user_id), keys.pending(user_id)
    idem, stream, quota = keys.idempotency(user_id, ""), keys.account_stream(user_id), keys.idempotency_quota(user_id)
    held, holds, hold_expiry = keys.held(user_id), keys.holds(user_id), keys.hold_expiry(user_id)
    grants, grant_expiry = keys.grants(user_id), keys.grant_expiry(user_id)
    partition_key = str(user_id)
    next_id = int(time.time() * 1000) << 22  # ids above any the handler's generator hands out in this run
    started = time.process_time()
    for payload, _ in payloads:
        event = json.loads(payload)
        amount = 1 if json.loads(event["body"])["amount"] == "0.01" else 0
        next_id += 1
        ts = int(time.time() * 1000)
        status, entry_id, balance_after, version, epoch, open_flag, _ = client.evalsha(
            sha,
            11,
            balance,
            keys.entry(user_id, next_id),
            pending,
            idem,
            stream,
            quota,
            held,
            holds,
            hold_expiry,
            grants,
            grant_expiry,
            "D",
            amount,
            ts,
            next_id,
            cfg.entry_ttl_s,
            "",
            cfg.idempotency_ttl_s,
            MAX_BALANCE,
            ts - stale_ms,
            "",
            "",
            user_id,
            "",
            "",
            cfg.max_pending_entries,
            "",
        )
        covered = canonical(
            {
                "type": "ledger",
                "id": next_id,
                "kind": "D",
                "user_id": user_id,
                "amount": amount,
                "balance_after": int(balance_after),
                "version": int(version),
                "epoch": epoch.decode(),
                "ts": ts,
                "open": open_flag.decode(),
                "idem_key": None,
            }
        )
        mac = hmac.digest(keyring.key, covered, hashlib.sha256).hex()
        publish(partition_key, b'%s,"kid":%s,"mac":"%s"}' % (covered[:-1], kid, mac.encode()))
        _answer_json(next_id, user_id, balance_after, int(version), "ASYNC")
    spent = time.process_time() - started
    assert status == b"ok", status
    return spent


def service_loop(user_id: int, payloads: list[tuple[str, str]]) -> None:
    """The deducts through the ledger service alone, as the route calls it, between the runtime's JSON of the event and
    of an answer: what is left of the handler without the HTTP layer (the invocation wrapper, the lane, validation,
    authorization, the route, the answer, the log and EMF lines, the tracer)."""
    from hotledger.ledger.feature import ledger

    service = ledger()
    environ = os.environ
    for payload, trace_header in payloads:
        environ["_X_AMZN_TRACE_ID"] = trace_header
        event = json.loads(payload)
        amount = 1 if json.loads(event["body"])["amount"] == "0.01" else 0
        result = service.deduct(user_id, amount)
        _answer_json(result.entry_id, user_id, result.balance, result.version, result.mode)


# the parts of the handler's work, named by a fragment of a frame's file path; a sample belongs to the innermost
# frame that names a part (stdlib, pydantic and the like name none: their time is their caller's)
PARTS = (
    ("redis-py: EVALSHA (pack, send, read)", ("/redis/", "dal/redis_store.py")),
    ("publish + broker ack (librdkafka)", ("dal/publisher.py",)),
    ("sign the event", ("dal/event_keys.py", "outbox/events.py")),
    ("logging", ("/logging/",)),
    ("metrics (EMF)", ("/metrics/",)),
    ("tracer (X-Ray)", ("/tracing/", "aws_xray_sdk/")),
    ("authorization", ("api/authorization.py",)),
    ("request validation", ("openapi_validation", "/openapi/", "api/app.py", "api/route_args.py", "api/schemas.py")),
    ("resolver (match, event, answer)", ("/event_handler/", "/data_classes/")),
    ("ledger route and service", ("hotledger/", "api/")),
    ("runtime: event json.loads, answer json.dumps", ("bench/hotpath.py",)),
)


def _part_of(frame) -> str:
    while frame is not None:
        path = frame.f_code.co_filename
        for part, fragments in PARTS:
            if any(fragment in path for fragment in fragments):
                return part
        frame = frame.f_back
    return "other"


def breakdown(payloads: list[tuple[str, str]], handler_us: float) -> dict[str, float]:
    """handler_us split over PARTS by where the samples fell while the handler loop ran."""
    counts: collections.Counter = collections.Counter()
    previous = signal.signal(signal.SIGPROF, lambda _signum, frame: counts.update((_part_of(frame),)))
    signal.setitimer(signal.ITIMER_PROF, SAMPLE_EVERY_S, SAMPLE_EVERY_S)
    try:
        handler_loop(payloads)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, previous)
    total = sum(counts.values())
    return {part: round(handler_us * n / total, 1) for part, n in counts.most_common()}


@contextlib.contextmanager
def lines_off():
    """The charge's INFO line and the invocation's EMF line switched off in the running handler: the service logger at
    WARNING (what LOG_LEVEL=WARNING sets), the invocation's metrics counted as ever and cleared unwritten at its
    flush."""
    import logging

    from api import app
    from hotledger import observability

    service_logger, provider = logging.getLogger(observability.SERVICE), app.metrics.provider
    level = service_logger.level
    service_logger.setLevel(logging.WARNING)
    provider.flush_metrics = lambda raise_on_empty_metrics=False: provider.metric_set.clear()
    try:
        yield
    finally:
        service_logger.setLevel(level)
        del provider.flush_metrics


WITHOUT_LINES_CHUNK = 200


def without_lines_rounds(deducts: int) -> int:
    return max(6, deducts // 100)


def ratio_without_lines(user_id: int, rounds: int, chunk: int = WITHOUT_LINES_CHUNK) -> float:
    """handler_vs_floor_cpu_ratio with the log and EMF lines off (lines_off): in each round a chunk of each loop, in
    turn in either order. The machine's speed drifts from round to round, both loops with it: the figure is the median
    of the rounds' ratios."""

    def without_lines() -> float:
        with lines_off():
            return handler_loop(_deduct_events(user_id, chunk))

    def floor() -> float:
        return floor_loop(user_id, _deduct_events(user_id, chunk))

    ratios = []
    for i in range(rounds):
        if i % 2:
            handler, floor_spent = without_lines(), floor()
        else:
            floor_spent, handler = floor(), without_lines()
        ratios.append(handler / floor_spent)
    return round(statistics.median(ratios), 2)


def figures(call, deducts: int, chunk: int = 100) -> dict:
    """handler_cpu_us_per_deduct, floor_cpu_us_per_deduct and their ratio; handler_cpu_us_per_recharge and its ratio
    to the deduct (a recharge also posts its held credit after the ack: ledger_post.lua). The loops alternate in
    chunks and each figure is the median over its chunks: the bench shares its cores with Redis, the broker and
    whatever else runs, and a chunk the scheduler disturbed must not move the figure."""
    user_id = _hot_account(call)
    handler_loop(_deduct_events(user_id, WARM_UP))
    handler_loop(_deduct_events(user_id, WARM_UP, route="recharge"))
    floor_loop(user_id, _deduct_events(user_id, WARM_UP))
    handler_us, floor_us, recharge_us = [], [], []
    for _ in range(max(1, deducts // chunk)):
        handler_us.append(handler_loop(_deduct_events(user_id, chunk)) / chunk * 1e6)
        floor_us.append(floor_loop(user_id, _deduct_events(user_id, chunk)) / chunk * 1e6)
        recharge_us.append(handler_loop(_deduct_events(user_id, chunk, route="recharge")) / chunk * 1e6)
    handler, floor, recharge = (
        statistics.median(handler_us),
        statistics.median(floor_us),
        statistics.median(recharge_us),
    )
    return {
        "handler_cpu_us_per_deduct": round(handler, 1),
        "floor_cpu_us_per_deduct": round(floor, 1),
        "handler_vs_floor_cpu_ratio": round(handler / floor, 2),
        "handler_cpu_us_per_recharge": round(recharge, 1),
        "recharge_vs_deduct_cpu_ratio": round(recharge / handler, 2),
        "handler_breakdown_us": breakdown(_deduct_events(user_id, deducts), handler),
        "handler_vs_floor_cpu_ratio_without_log_and_emf_lines": ratio_without_lines(
            user_id, rounds=without_lines_rounds(deducts)
        ),
    }


def profile(call, deducts: int, top: int) -> None:
    """cProfile the warm handler loop: the functions with the most cumulative and own time, per deduct."""
    user_id = _hot_account(call)
    handler_loop(_deduct_events(user_id, WARM_UP))
    payloads = _deduct_events(user_id, deducts)
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    handler_loop(payloads)
    profiler.disable()
    stats = pstats.Stats(profiler, stream=sys.stderr)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)


def hiredis_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("hiredis") is not None


def _child_env() -> dict[str, str]:
    """A measuring child's environment: this process's servers (run.environment), the API function's settings."""
    return {
        **os.environ,
        **production_env(),
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "functions"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }


def measure(deducts: int, hiredis: bool, profile_top: int = 0) -> dict:
    """figures() in a fresh process at the template's settings, on the servers this process's environment names
    (run.environment); `hiredis` False hides it from redis-py there."""
    env = _child_env()
    command = [sys.executable, str(Path(__file__).resolve()), "--in-process", "--deducts", str(deducts)]
    command += [] if hiredis else ["--no-hiredis"]
    command += ["--profile", str(profile_top)] if profile_top else []
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, check=True, text=True)
    return json.loads(done.stdout)


INSTRUCTIONS_DEDUCTS = 400  # under valgrind a deduct takes ~50 times its CPU; the count per deduct settles well before
COUNTED_LOOPS = ("setup", "handler", "handler-without-lines", "service", "floor")


def instructions(deducts: int = INSTRUCTIONS_DEDUCTS) -> dict:
    """Instructions per deduct of the handler's loop (as it runs and with its log and EMF lines off), of the ledger
    service's alone and of the floor's (valgrind's cachegrind in fresh processes at the template's settings, with
    hiredis when installed), each less a process that does the same setup and no loop."""
    import shutil
    import tempfile

    if shutil.which("valgrind") is None:
        raise RuntimeError("valgrind counts the instructions: apt-get install valgrind (infra/setup.sh installs it)")
    env = _child_env()
    counted = {}
    with tempfile.TemporaryDirectory() as out:
        for loop in COUNTED_LOOPS:
            counts = Path(out) / loop
            subprocess.run(
                [
                    "valgrind",
                    "--tool=cachegrind",
                    "--cache-sim=no",
                    f"--cachegrind-out-file={counts}",
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--count-loop",
                    loop,
                    "--deducts",
                    str(deducts),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=True,
            )
            summary = next(line for line in counts.read_text().splitlines() if line.startswith("summary:"))
            counted[loop] = int(summary.split()[1])
    per_deduct = {loop: (counted[loop] - counted["setup"]) / deducts for loop in COUNTED_LOOPS[1:]}
    return {
        "handler_instructions_per_deduct": round(per_deduct["handler"]),
        "handler_instructions_per_deduct_without_log_and_emf_lines": round(per_deduct["handler-without-lines"]),
        "service_instructions_per_deduct": round(per_deduct["service"]),
        "floor_instructions_per_deduct": round(per_deduct["floor"]),
        "handler_vs_floor_instructions_ratio": round(per_deduct["handler"] / per_deduct["floor"], 3),
    }


def _count_loop(loop: str, deducts: int) -> None:
    """The child of instructions(): the setup of a measurement (imports, servers, a warm handler and floor, the
    payloads built), then `loop` over the payloads, or nothing for "setup"."""
    import clients

    os.environ["_X_AMZN_TRACE_ID"] = _trace_header(1)
    clients.quiet()
    user_id = _hot_account(clients.api())
    handler_loop(_deduct_events(user_id, 25))
    floor_loop(user_id, _deduct_events(user_id, 25))
    payloads = _deduct_events(user_id, deducts)
    if loop == "handler":
        handler_loop(payloads)
    elif loop == "handler-without-lines":
        with lines_off():
            handler_loop(payloads)
    elif loop == "service":
        service_loop(user_id, payloads)
    elif loop == "floor":
        floor_loop(user_id, payloads)


def all_figures(deducts: int, profile_top: int = 0, counted: int = INSTRUCTIONS_DEDUCTS) -> dict:
    """The figures at the template's settings (with hiredis when installed, as the layer ships it), their instruction
    counts, and the handler's and floor's CPU without hiredis."""
    found = measure(deducts, hiredis_installed(), profile_top)
    found.update(instructions(counted))
    if hiredis_installed():
        without = measure(deducts, False)
        found.update(
            {
                f"{name}_without_hiredis": without[name]
                for name in ("handler_cpu_us_per_deduct", "floor_cpu_us_per_deduct", "handler_vs_floor_cpu_ratio")
            }
        )
    return found


def _in_process(deducts: int, hiredis: bool, profile_top: int) -> None:
    """The child of measure(): its figures as JSON on stdout."""
    if not hiredis:
        sys.modules["hiredis"] = None  # redis-py falls back to its Python parser and packer
    import clients

    os.environ["_X_AMZN_TRACE_ID"] = _trace_header(1)  # the setup's requests too are invocations
    real_stdout = sys.stdout
    clients.quiet()  # the handler prints its EMF metrics and log lines per invocation (Lambda: to CloudWatch)
    call = clients.api()
    found = figures(call, deducts)
    if profile_top:
        profile(call, deducts, profile_top)
    real_stdout.write(json.dumps(found))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 deducts per loop instead of 5,000")
    parser.add_argument("--deducts", type=int, default=None)
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="also cProfile the handler loop: top N to stderr"
    )
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-hiredis", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count-loop", choices=COUNTED_LOOPS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.count_loop:
        _count_loop(args.count_loop, args.deducts)
        return 0
    deducts = args.deducts or (1_000 if args.quick else 5_000)
    if args.in_process:
        _in_process(deducts, not args.no_hiredis, args.profile)
        return 0
    import harness

    with harness.environment():
        found = all_figures(deducts, args.profile)
    target = harness.TARGETS["handler_vs_floor_cpu_ratio"]
    for name, value in found.items():
        if isinstance(value, dict):
            print(f"{name}:")
            for part, us in value.items():
                print(f"  {part:46} {us:>8}")
        else:
            print(f"{name:40} {value:>10}")
    print(f"target: handler_vs_floor_cpu_ratio {target[0]} {target[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
