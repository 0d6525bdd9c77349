"""The hot account's ceiling, server side (issue 33 goal 2; called by bench/run.py; figures, never assertions).

One account, charged as fast as C clients with many connections can, each side measured where its deducts are
serialized, so that no Python process bounds either:

- Redis: the product's `ledger_apply` deduct (its exact KEYS and ARGV, recorded through LedgerStore.apply by
  bench/scripts.py) driven by `redis-benchmark`, each call a new entry id; and `INFO commandstats` EVALSHA µs per
  call, the script's own time on Redis's one thread.
- The database: the same deduct as one transaction on one row, driven by `mysqlslap` against a private MariaDB this
  stage starts with the durability an RDS/Aurora MySQL instance runs with (`innodb_flush_log_at_trx_commit=1`, the
  binlog on and `sync_binlog=1`), on the product's own schema (infra/migrations): SELECT ... FOR UPDATE, the balance
  checked, UPDATE the balance, INSERT the order row, COMMIT. Two ways: a stored procedure (one round trip; the row
  lock is held for the server's work and the commit's fsyncs only: the database's best case, the ratio's baseline),
  and the five statements sent one by one as an application sends them (three loopback round trips under the lock).

Then a model for AWS (AWS_IN_AZ_RTT_MS): Redis's ceiling for one account is one script call after another on its
one thread, 1e6 / (µs per call), with no network round trip inside it; the database's is 1e6 / (its serialized µs per
deduct + the round trips a Lambda pays while it holds the row lock: after the SELECT ... FOR UPDATE's answer, the
UPDATE, the INSERT, the COMMIT's request: three RTTs).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import statistics
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from infra import services

REPO = Path(__file__).resolve().parents[1]

# the ceiling's account: cached in this stage's Redis alone, an id no DB AUTO_INCREMENT reaches in a run
REDIS_USER = 9_000_000_779
DB_USER = 1
# redis-benchmark puts a random 12-digit number where its command line says __rand_int__: the entry id here
RAND_ENTRY_ID = 987_654_321_987
HUGE_BALANCE = 9_000_000_000_000_000 // 2

# The in-AZ round trip assumed for a Lambda in the database's VPC and AZ (ms). A same-AZ ping between EC2 instances
# measured 0.45 ms average (0.39 min; gist.github.com/josephmisiti/10312241); AWS publishes intra-AZ round-trip
# medians in CloudWatch / Network Manager Infrastructure Performance (docs.aws.amazon.com/network-manager/latest/
# infrastructure-performance/how-nmip-works.html). 0.25 ms is below both: the assumption favours the database.
AWS_IN_AZ_RTT_MS = 0.25
# round trips a Lambda pays under the row lock: the SELECT ... FOR UPDATE's answer back, UPDATE, INSERT, COMMIT's way out
DB_RTTS_UNDER_LOCK = 3

PROCEDURE = """
CREATE PROCEDURE ceiling_deduct(IN p_user INT, IN p_amount BIGINT)
BEGIN
  DECLARE v_balance BIGINT DEFAULT NULL;
  DECLARE v_version BIGINT DEFAULT NULL;
  START TRANSACTION;
  SELECT balance, version INTO v_balance, v_version FROM t_account WHERE user_id = p_user FOR UPDATE;
  IF v_balance >= p_amount THEN
    UPDATE t_account SET balance = v_balance - p_amount, version = v_version + 1 WHERE user_id = p_user;
    INSERT INTO t_order (id, user_id, amount, balance, version, mode, create_time)
      VALUES (v_version + 1, p_user, p_amount, v_balance - p_amount, v_version + 1, 'SYNC', NOW(3));
    COMMIT;
  ELSE
    ROLLBACK;
  END IF;
END"""
# the same transaction as an application sends it, statement by statement (mysqlslap sends each on its own); the
# check is the UPDATE's condition, the order row takes the row's new version as its id
STATEMENTS = [
    "START TRANSACTION",
    f"SELECT balance, version FROM t_account WHERE user_id = {DB_USER} FOR UPDATE",
    f"UPDATE t_account SET balance = balance - 1, version = version + 1 WHERE user_id = {DB_USER} AND balance >= 1",
    "INSERT INTO t_order (id, user_id, amount, balance, version, mode, create_time) "
    f"SELECT version, user_id, 1, balance, version, 'SYNC', NOW(3) FROM t_account WHERE user_id = {DB_USER}",
    "COMMIT",
]


class DurableMariaDB(services.MariaDBServer):
    """A private MariaDB with an RDS/Aurora MySQL instance's durability: the redo log flushed at every commit, the
    binlog on and synced at every commit."""

    name = "mariadb-durable"
    DURABILITY = {"innodb_flush_log_at_trx_commit": "1", "log_bin": "ON", "sync_binlog": "1"}

    def command(self) -> list[str]:
        return [
            *super().command(),
            "--log-bin=binlog",
            "--server-id=1",
            "--binlog-format=ROW",
            "--sync-binlog=1",
            "--innodb-flush-log-at-trx-commit=1",
            "--max-connections=500",
        ]

    def connect(self, database: str | None = None):
        import pymysql

        return pymysql.connect(host=self.host, port=self.port, user="root", database=database, autocommit=True)

    def durability(self) -> dict[str, str]:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                names = ", ".join(f"'{n}'" for n in self.DURABILITY)
                cur.execute(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({names})")
                return {name: value for name, value in cur.fetchall()}
        finally:
            conn.close()


def redis_side(redis_port: int, connections: int, requests: int) -> dict:
    """ledger_apply's deduct on one account from redis-benchmark: deducts/s, and EVALSHA µs per call from INFO
    commandstats over exactly that run."""
    import scripts

    from hotledger.dal.redis_store import lua as runner
    from hotledger.dal.redis_store import script_text

    lua = runner()
    scripts.load(lua, REDIS_USER, HUGE_BALANCE)
    name, keys, args = scripts.deduct_call(lua, REDIS_USER, RAND_ENTRY_ID)
    line = [str(x).replace(str(RAND_ENTRY_ID), "__rand_int__") for x in (*keys, *args)]
    sha = lua.sha(name)
    lua.client.script_load(script_text(REPO / f"layers/lua/{name}.lua"))
    balance_before = int(lua.client.hget(keys[0], "balance"))
    lua.client.config_resetstat()
    cpu_before = main_thread_cpu_s(lua.client.info("cpu"))
    cmd = ["redis-benchmark", "-p", str(redis_port), "-c", str(connections), "-n", str(requests), "-r", "1000000000"]
    out = subprocess.run(
        [*cmd, "-q", "evalsha", sha, str(len(keys)), *line], capture_output=True, text=True, check=True
    )
    cpu_s = main_thread_cpu_s(lua.client.info("cpu")) - cpu_before
    stat = lua.client.info("commandstats").get("cmdstat_evalsha", {})
    charged = balance_before - int(lua.client.hget(keys[0], "balance"))
    if charged < requests * 0.99:  # redis-benchmark counts error replies as requests too
        raise RuntimeError(f"redis-benchmark's ledger_apply charged {charged} of {requests}: {out.stdout[-2000:]}")
    return {
        "per_s": redis_benchmark_rate(out.stdout),
        "deducts": charged,
        "usec_per_call": round(float(stat["usec_per_call"]), 2),
        "calls": int(stat["calls"]),
        "thread_usec_per_call": round(cpu_s * 1e6 / int(stat["calls"]), 2),
    }


def main_thread_cpu_s(cpu: dict) -> float:
    """CPU seconds Redis's main thread has used (user + system): the thread every command is serialized on, so its
    time per call, reading the request and writing the reply included, is what one account's deducts queue for."""
    return float(cpu["used_cpu_user_main_thread"]) + float(cpu["used_cpu_sys_main_thread"])


def redis_benchmark_rate(output: str) -> float:
    """The last requests-per-second figure of `redis-benchmark -q` (it rewrites its progress line with \\r)."""
    return float(re.findall(r"([\d.]+) requests per second", output)[-1])


def mysqlslap_seconds(output: str) -> float:
    """The seconds mysqlslap took to run all queries (its average over iterations)."""
    found = re.search(r"Average number of seconds to run all queries: ([\d.]+) seconds", output)
    if not found:
        raise RuntimeError(f"no timing in mysqlslap's output: {output[-2000:]}")
    return float(found.group(1))


def _slap() -> str:
    for name in ("mariadb-slap", "mysqlslap"):
        if path := shutil.which(name):
            return path
    raise FileNotFoundError("neither mariadb-slap nor mysqlslap is installed (apt-get install mariadb-client)")


def mysqlslap(server: DurableMariaDB, schema: str, statements: list[str], deducts: int, connections: int) -> dict:
    """Run `deducts` transactions (each `statements`, sent one by one) over `connections` connections; deducts/s is
    the orders committed over mysqlslap's own time for the run (connections made before it starts)."""
    deducts = -(-deducts // connections) * connections  # mysqlslap gives each connection the same whole share
    conn = server.connect(schema)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM t_order")
            before = cur.fetchone()[0]
            cmd = [_slap(), "--no-defaults", "-h", server.host, "-P", str(server.port), "-uroot"]
            cmd += [f"--create-schema={schema}", f"--concurrency={connections}", "--iterations=1"]
            cmd += [
                f"--number-of-queries={deducts * len(statements)}",
                "--delimiter=;",
                f"--query={';'.join(statements)}",
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            cur.execute("SELECT COUNT(*) FROM t_order")
            committed = cur.fetchone()[0] - before
    finally:
        conn.close()
    if committed != deducts:
        raise RuntimeError(f"mysqlslap committed {committed} of {deducts} deducts: {out[-2000:]}")
    seconds = mysqlslap_seconds(out)
    return {"per_s": round(committed / seconds, 1), "deducts": committed, "seconds": seconds}


@contextmanager
def durable_db(root: Path):
    """A private durable MariaDB with the product's schema, one account on a huge balance and the stored procedure:
    (server, schema, its durability settings)."""
    from infra.migrate import migrate

    schema = "hotledger_ceiling"
    server = DurableMariaDB(services.free_port(), root).start()
    try:
        durability = server.durability()
        if durability != DurableMariaDB.DURABILITY:
            raise RuntimeError(f"the private MariaDB runs with {durability}, not {DurableMariaDB.DURABILITY}")
        migrate(server.host, server.port, "root", "", schema)
        conn = server.connect(schema)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "INSERT INTO t_account (user_id, balance, version) VALUES (%s, %s, 1)", (DB_USER, HUGE_BALANCE)
                )
                cur.execute(PROCEDURE)
        finally:
            conn.close()
        yield server, schema, durability
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def rounds(redis_port: int, root: Path, size, connections: int) -> dict:
    """Both sides in alternating rounds on the same shared machine, so that a noisy neighbour hits both: each
    figure the median of its rounds."""
    runs: dict[str, list[dict]] = {"redis": [], "procedure": [], "statements": []}
    deducts = size.pick(10_000, 3_000, 100)
    with durable_db(root) as (server, schema, durability):
        for _ in range(size.pick(5, 3, 1)):
            runs["redis"].append(redis_side(redis_port, connections, size.pick(200_000, 50_000, 2_000)))
            runs["procedure"].append(
                mysqlslap(server, schema, [f"CALL ceiling_deduct({DB_USER}, 1)"], deducts, connections)
            )
            runs["statements"].append(mysqlslap(server, schema, STATEMENTS, deducts, connections))
    medians = {side: {k: statistics.median(r[k] for r in found) for k in found[0]} for side, found in runs.items()}
    medians["durability"] = durability
    medians["rounds"] = len(runs["redis"])
    return medians


def _callgrind_total(root: Path, deducts: int) -> int:
    """Instructions a private redis-server ran under valgrind's callgrind, start to shutdown, with `deducts`
    ledger_apply deducts from redis-benchmark (one client) in between."""
    import redis
    import scripts

    from hotledger.dal.redis_store import Lua, script_text

    root.mkdir(parents=True, exist_ok=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = root / f"callgrind.{deducts}.out"
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "redis-server", "--port", str(port)]
        + ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port)
        for _ in range(600):  # valgrind starts Redis slowly
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        lua = Lua(client, str(REPO / "layers/lua"))
        scripts.load(lua, REDIS_USER, HUGE_BALANCE)
        name, keys, args = scripts.deduct_call(lua, REDIS_USER, RAND_ENTRY_ID)
        client.script_load(script_text(REPO / f"layers/lua/{name}.lua"))
        line = [str(x).replace(str(RAND_ENTRY_ID), "__rand_int__") for x in (*keys, *args)]
        cmd = ["redis-benchmark", "-p", str(port), "-c", "1", "-n", str(deducts), "-r", "1000000000", "-q"]
        subprocess.run([*cmd, "evalsha", lua.sha(name), str(len(keys)), *line], capture_output=True, check=True)
        charged = HUGE_BALANCE - int(client.hget(keys[0], "balance"))
        if charged != deducts:
            raise RuntimeError(f"callgrind's redis-benchmark charged {charged} of {deducts} deducts")
        with contextlib.suppress(redis.ConnectionError):
            client.shutdown(nosave=True)
        server.wait(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
    return int(re.search(r"^totals: (\d+)", out.read_text(), re.M).group(1))


def redis_instructions_per_deduct(root: Path, deducts: int) -> int:
    """Instructions Redis's process runs per ledger_apply deduct (valgrind's callgrind): a run of 2N deducts less one
    of N, over N, so that start-up and shutdown cancel. Unlike its CPU time, the count barely moves with the load."""
    once, twice = (_callgrind_total(root, count) for count in (deducts, 2 * deducts))
    return round((twice - once) / deducts)


def aws_model(usec_per_call: float, db_per_s: float, rtt_ms: float = AWS_IN_AZ_RTT_MS) -> dict:
    """Deducts/s on one hot account in AWS: Redis one script call after another (no round trip inside the
    serialized part), the database its serialized µs per deduct (measured: 1e6 / its rate on one row) plus the
    in-AZ round trips the Lambda pays under the row lock."""
    db_us = 1e6 / db_per_s
    redis = 1e6 / usec_per_call
    db = 1e6 / (db_us + DB_RTTS_UNDER_LOCK * rtt_ms * 1000)
    return {
        "db_us_per_deduct": round(db_us, 1),
        "redis_per_s": round(redis, 1),
        "db_per_s": round(db, 1),
        "ratio": round(redis / db, 1),
    }


def figures(redis_port: int, state: Path, size) -> dict:
    """{name: (value, unit, samples, baseline, measures)} for run.py."""
    connections = size.pick(32, 32, 8)
    found = rounds(redis_port, state / "mariadb-ceiling", size, connections)
    redis, proc, stmts = found["redis"], found["procedure"], found["statements"]
    model = aws_model(redis["thread_usec_per_call"], proc["per_s"])
    counted = size.pick(4_000, 1_000, 50)
    instructions = redis_instructions_per_deduct(state / "redis-callgrind", counted)
    durable = ", ".join(f"{k}={v}" for k, v in found["durability"].items())
    on_db = f"one account's row on a private MariaDB ({durable}), mysqlslap, {connections} connections"
    median = f"the median of {found['rounds']} rounds alternating with the other side"
    return {
        "hot_account_ceiling_ratio": (
            round(model["db_us_per_deduct"] / redis["thread_usec_per_call"], 1),
            "ratio",
            None,
            "hot_account_db_us_per_deduct",
            "the time one account's deducts are serialized for, per deduct, where each side serializes them: the "
            "database's row lock (hot_account_db_us_per_deduct) over Redis's main thread "
            "(redis_thread_usec_per_deduct); the hot account's ceiling on each side is 1e6 over it",
        ),
        "redis_thread_usec_per_deduct": (
            redis["thread_usec_per_call"],
            "µs",
            redis["calls"],
            None,
            "Redis's main-thread CPU (INFO cpu used_cpu_user/sys_main_thread) per ledger_apply deduct over a "
            f"redis-benchmark run, reading the request and writing the reply included; {median}",
        ),
        "redis_instructions_per_deduct": (
            instructions,
            "instructions",
            counted,
            None,
            "instructions the redis-server process ran per ledger_apply deduct under valgrind's callgrind (a run of "
            "2N deducts from redis-benchmark, one client, less a run of N, over N): what redis_thread_usec_per_deduct "
            "measures, counted so that the machine's load does not move it",
        ),
        "ledger_apply_evalsha_usec_per_call": (
            redis["usec_per_call"],
            "µs",
            redis["calls"],
            None,
            f"INFO commandstats EVALSHA usec_per_call over the same runs: the script alone; {median}",
        ),
        "hot_account_db_us_per_deduct": (
            model["db_us_per_deduct"],
            "µs",
            proc["deducts"],
            None,
            "the database's serialized time per deduct on one row: 1e6 / hot_account_db_deducts_per_s",
        ),
        "hot_account_redis_deducts_per_s": (
            redis["per_s"],
            "1/s",
            redis["deducts"],
            "hot_account_db_deducts_per_s",
            f"ledger_apply's deduct on one account (the product's KEYS and ARGV), redis-benchmark, {connections} "
            "connections, one call per round trip; on 2 shared cores the C client takes the CPU Redis's thread "
            f"would use, so this is below Redis's ceiling; {median}",
        ),
        "hot_account_db_deducts_per_s": (
            proc["per_s"],
            "1/s",
            proc["deducts"],
            None,
            f"the same deduct as one transaction (SELECT FOR UPDATE, check, UPDATE, INSERT t_order, COMMIT) in a "
            f"stored procedure, one round trip each, on {on_db}; {median}",
        ),
        "hot_account_db_statements_deducts_per_s": (
            stmts["per_s"],
            "1/s",
            stmts["deducts"],
            "hot_account_db_deducts_per_s",
            f"the same transaction sent statement by statement (three loopback round trips under the lock), on "
            f"{on_db}; {median}",
        ),
        "hot_account_throughput_ratio": (
            round(redis["per_s"] / proc["per_s"], 1),
            "ratio",
            None,
            "hot_account_db_deducts_per_s",
            "deducts/s on one account, Redis over the database, both from C clients on this machine (Redis's side "
            "client-bound: see hot_account_redis_deducts_per_s)",
        ),
        "hot_account_aws_redis_ceiling_per_s": (
            model["redis_per_s"],
            "1/s",
            None,
            None,
            "AWS model: 1e6 / redis_thread_usec_per_deduct (no round trip inside Redis's serialized work)",
        ),
        "hot_account_aws_db_ceiling_per_s": (
            model["db_per_s"],
            "1/s",
            None,
            None,
            f"AWS model: 1e6 / (hot_account_db_us_per_deduct + {DB_RTTS_UNDER_LOCK} in-AZ round trips of "
            f"{AWS_IN_AZ_RTT_MS} ms the Lambda pays under the row lock)",
        ),
        "hot_account_aws_ceiling_ratio": (
            model["ratio"],
            "ratio",
            None,
            "hot_account_aws_db_ceiling_per_s",
            "AWS model: the two ceilings' ratio (bench/ceiling.py, docs/performance.md)",
        ),
    }
