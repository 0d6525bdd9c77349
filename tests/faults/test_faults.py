"""Faults with real process kills, on private Redis, MariaDB and broker instances (own ports and dirs):
broker down during deducts, writer killed between its DB commit and its offset commit, Redis restarted
empty (failover that lost writes), DB down for a while. After each: nothing acknowledged is lost,
nothing is applied twice, and Redis and the DB agree."""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from collections import Counter

import pymysql
import pytest

from helpers import LocalService
from infra import services
from infra.migrate import migrate


class Stack:
    """Private Redis (or the Redis Cluster given), MariaDB and broker."""

    def __init__(self, root, redis_server=None):
        self.root = root
        self.redis = redis_server or services.RedisServer(services.free_port(), root / "redis")
        self.db = services.MariaDBServer(services.free_port(), root / "mariadb")
        self.broker = services.TansuBroker(services.free_port(), root / "broker")
        self.topic = "hotledger.faults"

    def start(self):
        for server in (self.redis, self.db, self.broker):
            server.start()
        migrate("127.0.0.1", self.db.port, "root", "", "hotledger")
        services.ensure_topic(self.broker.bootstrap, self.topic, 2)
        return self

    def stop(self):
        for server in (self.redis, self.db, self.broker):
            server.stop()

    @property
    def env(self) -> dict:
        return {
            "REDIS_URL": self.redis.url,
            "DB_HOST": "127.0.0.1",
            "DB_PORT": str(self.db.port),
            "DB_USER": "root",
            "DB_PASSWORD": "",
            "DB_NAME": "hotledger",
            "KAFKA_BOOTSTRAP": self.broker.bootstrap,
            "KAFKA_TOPIC": self.topic,
            "PUBLISH_TIMEOUT_S": "2",
            "HOTLEDGER_LOCAL_SCHEDULE_RATE_S": "1",
            "RECONCILE_AGE_S": "3",
            "HOTLEDGER_API_WORKERS": "2",
        }

    def kill_broker(self, down_s: float = 2) -> None:
        """SIGKILL the broker (it loses everything it held), and after down_s start it again with the topic."""
        self.broker.kill()
        time.sleep(down_s)
        self.broker.restart()
        services.ensure_topic(self.broker.bootstrap, self.topic, 2)

    def pause_redis(self, for_s: float) -> None:
        """SIGSTOP Redis for for_s seconds, then SIGCONT: every request in between waits or times out."""
        os.kill(self.redis.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(for_s)
        finally:
            os.kill(self.redis.proc.pid, signal.SIGCONT)

    def service(self, name: str, *args: str, **env) -> LocalService:
        return LocalService(services.free_port(), {**self.env, **env}, self.root / f"{name}.log", args)

    def sql(self, statement: str, args=None):
        conn = pymysql.connect(host="127.0.0.1", port=self.db.port, user="root", password="", database="hotledger")
        try:
            with conn.cursor() as cur:
                cur.execute(statement, args)
                return cur.fetchall()
        finally:
            conn.close()

    def cache(self, user_id: int) -> int | None:
        value = self.redis.client().hget(f"user:balance:{{{user_id}}}", "balance")
        return None if value is None else int(value)

    def cache_mode(self, user_id: int) -> str | None:
        value = self.redis.client().hget(f"user:balance:{{{user_id}}}", "mode")
        return None if value is None else value.decode()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = Stack(tmp_path_factory.mktemp("faults")).start()
    yield stack
    stack.stop()


def _account(api: LocalService, balance: str, **fields) -> int:
    status, body = api.request("POST", "/accounts", {"user_name": f"f-{time.monotonic_ns()}", **fields})
    assert status == 201, body
    assert api.request("POST", f"/accounts/{body['user_id']}/recharge", {"amount": balance})[0] == 200
    return body["user_id"]


def _converged(stack: Stack, api: LocalService, user_id: int, expected: int, timeout_s: float = 60) -> None:
    """The DB and the Redis cache both hold `expected` (a cache Redis does not hold is loaded through the API's GET)."""

    def agree():
        db = stack.sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,))
        if stack.cache(user_id) is None:
            api.request("GET", f"/accounts/{user_id}")
        return db and db[0][0] == expected and stack.cache(user_id) == expected

    LocalService.wait_until(agree, timeout_s, f"DB and Redis to agree on {expected} for account {user_id}", 0.5)


def test_broker_down_during_deduct_charges_nothing(stack):
    svc = stack.service("broker-down").start()
    try:
        user_id = _account(svc, "10.00")
        assert svc.request("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200
        stack.broker.kill()
        status, body = svc.request("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"})
        assert status == 503 and body["error"]["code"] == "PUBLISH_FAILED"
        account = svc.request("GET", f"/accounts/{user_id}")[1]
        assert account["balance"] == "9.00" and account["pending_orders"] <= 2
        stack.broker.restart()
        services.ensure_topic(stack.broker.bootstrap, stack.topic, 2)
        outcomes = []

        def charged_again():
            status, _ = svc.request("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"})
            outcomes.append(status)
            return status == 200

        LocalService.wait_until(charged_again, 60, "the producer to recover after the broker restart", 1.0)
        assert set(outcomes) <= {200, 503}
        # the broker lost its memory: what it held is persisted by the reconciler from the Redis entries
        _converged(stack, svc, user_id, 600)
        assert stack.sql("SELECT COUNT(*) FROM t_order WHERE user_id = %s", (user_id,)) == ((2,),)
    finally:
        svc.stop()


def test_writer_killed_between_db_commit_and_offset_commit(stack):
    api = stack.service("api-only", "--no-msk", "--no-schedules").start()
    slow_writer = stack.service("writer-1", "--no-api", "--no-schedules", HOTLEDGER_LOCAL_COMMIT_DELAY_S="30").start(
        wait_http=False
    )
    try:
        user_id = _account(api, "100.00")
        for _ in range(20):
            assert api.request("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200
        LocalService.wait_until(
            lambda: stack.sql("SELECT COUNT(*) FROM t_order WHERE user_id = %s", (user_id,))[0][0] == 20,
            60,
            "the first writer to commit the batch to the DB",
            0.5,
        )
        assert "committing" in slow_writer.log_text()
        slow_writer.kill()  # offsets not committed: the batch will come again
        writer = stack.service("writer-2", "--no-api", "--no-schedules").start(wait_http=False)
        try:
            LocalService.wait_until(
                lambda: re.search(r'"WriterDuplicates":\[?[1-9]', writer.log_text()),
                60,
                "the re-delivered batch to reach the new writer",
                0.5,
            )
            assert stack.sql("SELECT COUNT(*), SUM(amount) FROM t_order WHERE user_id = %s", (user_id,)) == (
                (20, 2000),
            )
            _converged(stack, api, user_id, 8000)
        finally:
            writer.stop()
    finally:
        api.stop()
        slow_writer.kill()


def test_redis_restarted_empty_is_restored_from_the_db(stack):
    full = stack.service("before-redis-loss").start()
    user_id = _account(full, "100.00")
    _converged(stack, full, user_id, 10_000)
    full.stop()
    api = stack.service("api-redis", "--no-msk", "--no-schedules").start()
    try:
        for _ in range(5):
            assert api.request("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"})[0] == 200
        # these five are acknowledged and in the broker, not in the DB, when Redis loses everything
        stack.redis.kill()
        stack.redis.restart()
        status, body = api.request("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
        assert status == 200 and body["balance"] == "99.00"  # reloaded from the DB, which misses the five
        full = stack.service("after-redis-loss").start()
        try:
            _converged(stack, full, user_id, 10_000 - 5 * 200 - 100, timeout_s=90)
            LocalService.wait_until(
                lambda: stack.cache(user_id) == 8900, 60, "the reconciler to correct the cache", 0.5
            )
            assert stack.sql("SELECT COUNT(*) FROM t_order WHERE user_id = %s", (user_id,)) == ((6,),)
        finally:
            full.stop()
    finally:
        api.stop()


def test_order_reminders_survive_redis_restarted_empty(stack):
    """Reminders due a few seconds after their orders are created; Redis is killed and restarted empty
    before they are due. Every open order's reminder still reaches its owner's inbox exactly once (the
    reconciler offers it again from the DB), and no paid order's does."""
    svc = stack.service("reminders", REMINDER_BEFORE_CLOSE_S="60").start()
    try:
        orders = {}
        for _ in range(12):
            user_id = _account(svc, "5.00")
            status, body = svc.request("POST", "/orders", {"user_id": user_id, "amount": "1.00", "close_in_s": 64})
            assert status == 201, body
            orders[body["order_id"]] = user_id
        paid = list(orders)[:4]
        for order_id in paid:
            assert svc.request("POST", f"/orders/{order_id}/pay")[0] == 200
        stack.redis.kill()
        stack.redis.restart()

        def reminders():
            return {
                order_id: [m["outer_biz_id"] for m in svc.request("GET", f"/inbox/{user_id}/messages")[1]["messages"]]
                for order_id, user_id in orders.items()
            }

        expected = {order_id: [] if order_id in paid else [order_id] for order_id in orders}
        LocalService.wait_until(lambda: reminders() == expected, 60, "one reminder per open order", 0.5)
        time.sleep(3)  # more drainer and reconciler runs change nothing
        assert reminders() == expected
    finally:
        svc.stop()


def test_db_down_for_a_while_then_the_writer_catches_up(stack):
    svc = stack.service("db-down").start()
    try:
        user_id = _account(svc, "50.00")
        _converged(stack, svc, user_id, 5000)
        status, body = svc.request(
            "POST", "/accounts", {"user_name": f"sync-{time.monotonic_ns()}", "deduct_type": "SYNC"}
        )
        sync_id = body["user_id"]
        assert svc.request("POST", f"/accounts/{sync_id}/recharge", {"amount": "5.00"})[0] == 200
        stack.db.kill()
        for _ in range(10):
            assert svc.request("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200
        status, body = svc.request("POST", f"/accounts/{sync_id}/deduct", {"amount": "1.00"})
        assert status == 503 and body["error"]["code"] == "SERVICE_UNAVAILABLE"  # SYNC needs the DB
        time.sleep(3)  # the writer fails and retries meanwhile
        stack.db.restart()
        _converged(stack, svc, user_id, 4000, timeout_s=90)
        assert stack.sql("SELECT COUNT(*) FROM t_order WHERE user_id = %s", (user_id,)) == ((10,),)
        assert stack.sql("SELECT balance FROM t_account WHERE user_id = %s", (sync_id,)) == ((500,),)
    finally:
        svc.stop()


def test_redis_down_answers_503_and_charges_nothing(stack):
    svc = stack.service("redis-down").start()
    try:
        user_id = _account(svc, "20.00")
        _converged(stack, svc, user_id, 2000)
        stack.redis.kill()
        status, body = svc.request("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
        assert status == 503 and body["error"]["code"] == "SERVICE_UNAVAILABLE"
        stack.redis.restart()
        assert svc.request("GET", f"/accounts/{user_id}")[1]["balance"] == "20.00"
        assert svc.request("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200
        _converged(stack, svc, user_id, 1900)
        assert stack.sql("SELECT COUNT(*) FROM t_order WHERE user_id = %s", (user_id,)) == ((1,),)
    finally:
        svc.stop()


class _ClientThreads:
    """Runs self.threads from entering the block until leaving it."""

    threads: list[threading.Thread]
    stopped: threading.Event

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        for t in self.threads:
            t.join()


class ChaosClients(_ClientThreads):
    """Threads deducting random amounts from random accounts until stopped, recording every answer."""

    def __init__(self, api: LocalService, accounts: list[int], threads: int = 4):
        self.api, self.accounts = api, accounts
        self.acked: dict[int, tuple[int, int]] = {}  # order id -> (account, cents)
        self.unknown: dict[int, tuple[int, int]] = {}  # OUTCOME_UNKNOWN entry id -> (account, cents)
        self.answers: Counter = Counter()
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(seed,)) for seed in range(threads)]

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stopped.is_set():
            user_id, cents = rng.choice(self.accounts), rng.randint(1, 100)
            status, body = self.api.request(
                "POST", f"/accounts/{user_id}/deduct", {"amount": f"{cents // 100}.{cents % 100:02d}"}
            )
            code = body["error"]["code"] if status >= 400 and body else None
            self.answers[(status, code)] += 1
            if status == 200:
                self.acked[int(body["order_id"])] = (user_id, cents)
            elif code == "OUTCOME_UNKNOWN" and "entry_id" in body["error"]:  # without one: a backing service's lost
                self.unknown[int(body["error"]["entry_id"])] = (user_id, cents)  # answer before any charge was made


def acknowledged_deducts_in_the_db_exactly_once(
    stack: Stack, api: LocalService, clients: ChaosClients, accounts: list[int], funded: int
) -> None:
    """Once nothing is pending: every acknowledged deduct is in the DB exactly once, nothing else is but OUTCOME_UNKNOWN
    answers, and every account's balance is the same in the DB and in Redis and matches its persisted orders."""

    def all_acked_persisted():
        ids = list(clients.acked)
        found = stack.sql(f"SELECT COUNT(*) FROM t_order WHERE id IN ({','.join(['%s'] * len(ids))})", ids)[0][0]
        pending = sum(api.request("GET", f"/accounts/{user_id}")[1]["pending_orders"] for user_id in accounts)
        return found == len(ids) and pending == 0

    LocalService.wait_until(all_acked_persisted, 120, "every acknowledged deduct in the DB and nothing pending", 1.0)
    rows = stack.sql(
        f"SELECT id, user_id, amount FROM t_order WHERE user_id IN ({','.join(['%s'] * len(accounts))})", accounts
    )
    persisted = {order_id: (user_id, amount) for order_id, user_id, amount in rows}
    assert len(persisted) == len(rows)
    assert {i: persisted[i] for i in clients.acked} == clients.acked
    assert set(persisted) - set(clients.acked) <= set(clients.unknown)
    for user_id in accounts:
        charged = sum(amount for uid, amount in persisted.values() if uid == user_id)
        _converged(stack, api, user_id, funded - charged)


def test_deducts_under_repeated_kills_reach_the_db_exactly_once(stack):
    """Four clients deduct without pause while, one after another, the writer+reconciler process is
    SIGKILLed and replaced, the broker is killed (losing everything it held) and restarted, Redis stalls
    (SIGSTOP) for longer than the client's timeouts, and the DB is killed and restarted. Afterwards every
    acknowledged deduct is in the DB exactly once, nothing else is except OUTCOME_UNKNOWN answers (either
    way), and every account's balance is the same in the DB and in Redis and matches its persisted orders."""
    api = stack.service("chaos-api", "--no-msk", "--no-schedules").start()
    background = stack.service("chaos-writer-1", "--no-api").start(wait_http=False)
    try:
        accounts = [_account(api, "100000.00") for _ in range(8)]  # never exhausted: every answer is 200 or 503
        with ChaosClients(api, accounts) as clients:
            time.sleep(4)
            background.kill()
            time.sleep(3)
            background = stack.service("chaos-writer-2", "--no-api").start(wait_http=False)
            time.sleep(4)
            stack.kill_broker()
            time.sleep(4)
            stack.pause_redis(8)  # longer than a request's Redis timeouts and retries (~6 s)
            time.sleep(3)
            stack.db.kill()
            time.sleep(3)
            stack.db.restart()
            time.sleep(3)
        expected_answers = {
            (200, None),
            (503, "PUBLISH_FAILED"),
            (503, "SERVICE_UNAVAILABLE"),
            (503, "OUTCOME_UNKNOWN"),
        }
        assert set(clients.answers) <= expected_answers, clients.answers
        assert clients.answers[(200, None)] > 100 and clients.answers[(503, "PUBLISH_FAILED")] > 0, clients.answers

        acknowledged_deducts_in_the_db_exactly_once(stack, api, clients, accounts, 10_000_000)
    finally:
        api.stop()
        background.stop()


class SaleClients(_ClientThreads):
    """Buyers (a new user id per attempt) on a voucher and grabbers (each account once) on a red packet,
    without pause until stopped, recording every answer."""

    def __init__(self, api: LocalService, voucher_id: str, packet_id: str, grabbers: list[int]):
        self.api, self.voucher_id, self.packet_id, self.grabbers = api, voucher_id, packet_id, grabbers
        self.orders: dict[int, int] = {}  # order id -> user id
        self.grabs: dict[int, int] = {}  # grabber -> amount
        self.unknown_orders: set[int] = set()
        self.answers: Counter = Counter()
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._buy, args=(n,)) for n in range(3)] + [
            threading.Thread(target=self._grab)
        ]

    def _record(self, what: str, status: int, body) -> str | None:
        code = body["error"]["code"] if status >= 400 and body else None
        self.answers[(what, status, code)] += 1
        return code

    def _buy(self, n: int) -> None:
        user = 2_000_000 + n * 1_000_000
        while not self.stopped.is_set():
            user += 1
            status, body = self.api.request("POST", f"/vouchers/{self.voucher_id}/orders", {"user_id": user})
            if self._record("order", status, body) == "OUTCOME_UNKNOWN" and "entry_id" in body["error"]:
                self.unknown_orders.add(int(body["error"]["entry_id"]))
            if status == 200:
                self.orders[int(body["order_id"])] = user

    def _grab(self) -> None:
        for user in self.grabbers:
            if self.stopped.wait(0.04):
                return
            status, body = self.api.request("POST", f"/redpackets/{self.packet_id}/grab", {"user_id": user})
            self._record("grab", status, body)
            if status == 200:
                self.grabs[user] = int(body["amount"].replace(".", ""))


def test_flash_sale_and_red_packet_under_kills_lose_and_double_nothing(stack):
    """Buyers and grabbers run while the writer process is SIGKILLed and replaced, the broker is killed
    (losing what it held) and restarted, and Redis is killed and restarted empty. Afterwards every
    acknowledged order and grab is in the DB exactly once, the voucher's Redis stock + pending + sold = its
    stock, and every grabber was credited exactly their amount."""
    api = stack.service("sale-api", "--no-msk", "--no-schedules", REBUILD_HOLD_S="2").start()
    background = stack.service("sale-writer-1", "--no-api", REBUILD_HOLD_S="2").start(wait_http=False)
    try:
        now = int(time.time() * 1000)
        voucher_id = api.request(
            "POST", "/vouchers", {"title": "chaos", "stock": 100_000, "begin_at": now - 1000, "end_at": now + 3_600_000}
        )[1]["voucher_id"]
        sender = _account(api, "1000.00")
        grabbers = []
        for _ in range(500):
            status, body = api.request("POST", "/accounts", {"user_name": f"g-{time.monotonic_ns()}"})
            grabbers.append(body["user_id"])
        packet_id = api.request(
            "POST", "/redpackets", {"sender_id": sender, "total": "500.00", "count": 500, "expires_in_s": 3600}
        )[1]["packet_id"]
        with SaleClients(api, voucher_id, packet_id, grabbers) as clients:
            time.sleep(3)
            background.kill()
            time.sleep(2)
            background = stack.service("sale-writer-2", "--no-api", REBUILD_HOLD_S="2").start(wait_http=False)
            time.sleep(3)
            stack.kill_broker()
            time.sleep(4)
            # what the broker lost (events before its restart, and after it those a consumer skipped because the
            # offsets started over) is persisted from Redis by the reconciler before Redis fails in turn: losing
            # both first is the one double fault this design does not survive (docs/guarantees.md)
            orders_before, grabs_before = list(clients.orders), list(clients.grabs)

            def broker_losses_persisted():
                orders = stack.sql(
                    f"SELECT COUNT(*) FROM t_voucher_order WHERE id IN ({','.join(['%s'] * len(orders_before))})",
                    orders_before,
                )[0][0]
                grabs = stack.sql(
                    "SELECT COUNT(*) FROM t_red_packet_item WHERE packet_id = %s AND user_id IN ("
                    + ",".join(["%s"] * len(grabs_before))
                    + ")",
                    [int(packet_id), *grabs_before],
                )[0][0]
                return orders == len(orders_before) and grabs == len(grabs_before)

            try:
                LocalService.wait_until(broker_losses_persisted, 60, "what the broker lost to be persisted", 0.5)
            except AssertionError:
                persisted_orders = {row[0] for row in stack.sql("SELECT id FROM t_voucher_order")}
                persisted_grabs = {
                    row[0] for row in stack.sql("SELECT user_id FROM t_red_packet_item WHERE user_id IS NOT NULL")
                }
                raise AssertionError(
                    f"not persisted: orders {sorted(set(orders_before) - persisted_orders)[:10]} "
                    f"grabs {sorted(set(grabs_before) - persisted_grabs)[:10]}"
                ) from None
            stack.redis.kill()
            stack.redis.restart()
            time.sleep(5)
        answers = {(what, status, code) for what, status, code in clients.answers}
        allowed = {
            ("order", 200, None),
            ("order", 503, "PUBLISH_FAILED"),
            ("order", 503, "SERVICE_UNAVAILABLE"),
            ("order", 503, "OUTCOME_UNKNOWN"),
            ("order", 503, "RECOVERING"),
            ("grab", 200, None),
            ("grab", 503, "PUBLISH_FAILED"),
            ("grab", 503, "SERVICE_UNAVAILABLE"),
            ("grab", 503, "RECOVERING"),
            ("grab", 409, "EMPTY"),
        }
        assert answers <= allowed, clients.answers
        assert clients.answers[("order", 200, None)] > 100 and len(clients.grabs) > 50, clients.answers

        def settled():
            view = api.request("GET", f"/vouchers/{voucher_id}")[1]
            return view and view["pending"] == 0 and view["sold"] >= len(clients.orders)

        LocalService.wait_until(settled, 120, "every acknowledged order in the DB", 1.0)
        persisted = dict(stack.sql("SELECT id, user_id FROM t_voucher_order WHERE voucher_id = %s", (int(voucher_id),)))
        assert {i: persisted.get(i) for i in clients.orders} == clients.orders
        assert set(persisted) - set(clients.orders) <= clients.unknown_orders
        view = api.request("GET", f"/vouchers/{voucher_id}")[1]
        assert view["stock_left"] + view["sold"] + view["pending"] == 100_000
        assert stack.sql("SELECT stock FROM t_seckill_voucher WHERE id = %s", (int(voucher_id),)) == (
            (100_000 - len(persisted),),
        )

        def claims():
            return dict(
                stack.sql(
                    "SELECT user_id, amount FROM t_red_packet_item WHERE packet_id = %s AND user_id IS NOT NULL",
                    (int(packet_id),),
                )
            )

        LocalService.wait_until(lambda: claims() == clients.grabs, 120, "every acknowledged grab in the DB once", 1.0)
        for user, amount in clients.grabs.items():
            _converged(stack, api, user, amount)
    finally:
        api.stop()
        background.stop()
