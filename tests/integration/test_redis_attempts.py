"""Outcome unknown vs nothing changed is decided from every redis-py attempt (issue 10, item 4).

A small TCP proxy in front of the run's Redis forwards everything until the script under test goes out: that
EVALSHA reaches Redis and runs, its reply is swallowed, the client's connection is dropped and the proxy's port
is closed, so redis-py's resends are refused. The last attempt says "connection refused", yet the first one
ran: the answer must be 503 OUTCOME_UNKNOWN naming the change, never "nothing changed"."""

from __future__ import annotations

import select
import socket
import threading
import time
from urllib.parse import urlparse

import pytest

from hotledger.config import with_values
from hotledger.dal.redis_store import Lua, connect

NOW_MS = int(time.time() * 1000)


class DropAfterScript:
    """Forwards to Redis until a command carrying `marker` (a script's sha) passes; then swallows Redis's reply,
    runs `between` (if given), drops the client and, with `refuse`, closes the listening port (every reconnect
    is refused); without it, the resends go through."""

    def __init__(self, upstream: tuple[str, int], refuse: bool = True, between=None):
        self.upstream, self.refuse, self.between = upstream, refuse, between
        self.marker: bytes | None = None
        self.fired = threading.Event()
        self.closed = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, sha: str) -> None:
        self.marker = sha.encode()

    def _accept(self) -> None:
        while not self.closed.is_set():
            if select.select([self.listener], [], [], 0.05)[0]:
                try:
                    client, _ = self.listener.accept()
                except OSError:
                    return
                threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.upstream)
        try:
            while True:
                readable = select.select([client, upstream], [], [], 0.5)[0]
                if self.closed.is_set() and not readable:
                    return
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        upstream.sendall(data)
                        if self.marker and self.marker in data and not self.fired.is_set():
                            upstream.recv(65536)  # Redis ran the script and answered: the answer is lost
                            self.fired.set()
                            if self.between:
                                self.between()
                            if self.refuse:
                                self.close()
                            return
                    else:
                        client.sendall(data)
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


@pytest.fixture
def proxy(settings):
    url = urlparse(settings.redis_url)
    drop = DropAfterScript((url.hostname, url.port))
    yield drop
    drop.close()


def proxied_lua(settings, proxy: DropAfterScript) -> Lua:
    url = urlparse(settings.redis_url)
    cfg = with_values(settings, redis_url=url._replace(netloc=f"127.0.0.1:{proxy.port}").geturl())
    return Lua(connect(cfg), cfg.lua_dir)


def through_proxy(monkeypatch, store, lua: Lua) -> None:
    monkeypatch.setattr(store, "lua", lua)
    monkeypatch.setattr(store, "redis", lua.client)


@pytest.mark.single_redis  # the proxy stands in front of one Redis (a cluster client goes to the nodes it is told of)
def test_a_deduct_that_ran_before_its_resends_were_refused_is_outcome_unknown(api, settings, proxy, monkeypatch):
    """Before the fix: 503 SERVICE_UNAVAILABLE ("nothing was changed") while Redis had charged 4.00."""
    from hotledger.ledger.feature import ledger

    user_id = api.account(balance="10.00")
    lua = proxied_lua(settings, proxy)
    through_proxy(monkeypatch, ledger().store, lua)
    script = lua._scripts["ledger_apply"]
    lua.client.script_load(script.script)
    proxy.arm(script.sha)
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"})
    monkeypatch.undo()
    assert proxy.fired.is_set()
    assert (status, body["error"]["code"]) == (503, "OUTCOME_UNKNOWN"), body
    entry_id = body["error"]["entry_id"]
    # the charge stands, under the id the answer named
    status, order = api("GET", f"/accounts/{user_id}/orders/{entry_id}")
    assert status == 200 and order["amount"] == "4.00" and order["status"] == "PENDING"
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "6.00"


@pytest.mark.single_redis
def test_a_voucher_order_that_ran_before_its_resends_were_refused_is_outcome_unknown(api, settings, proxy, monkeypatch):
    """Before the fix: 503 SERVICE_UNAVAILABLE while Redis had taken the unit."""
    from hotledger.vouchers.feature import vouchers

    status, body = api(
        "POST", "/vouchers", {"title": "10 off", "stock": 5, "begin_at": NOW_MS - 1000, "end_at": NOW_MS + 3_600_000}
    )
    assert status == 201, body
    voucher_id = int(body["voucher_id"])
    assert api("GET", f"/vouchers/{voucher_id}")[1]["stock_left"] == 5  # loaded into Redis
    lua = proxied_lua(settings, proxy)
    through_proxy(monkeypatch, vouchers().redis, lua)
    script = lua._scripts["voucher_order"]
    lua.client.script_load(script.script)  # the EVALSHA that gets through runs (no NOSCRIPT on a fresh Redis)
    proxy.arm(script.sha)
    status, body = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": 42})
    monkeypatch.undo()
    assert proxy.fired.is_set()
    assert (status, body["error"]["code"]) == (503, "OUTCOME_UNKNOWN"), body
    status, order = api("GET", f"/vouchers/{voucher_id}/orders/{body['error']['entry_id']}")
    assert status == 200 and order["user_id"] == 42 and order["status"] == "PENDING"
    assert api("GET", f"/vouchers/{voucher_id}")[1]["stock_left"] == 4


@pytest.mark.single_redis
def test_a_resend_refused_without_any_attempt_reaching_redis_still_says_nothing_changed(
    api, settings, proxy, monkeypatch
):
    """The other side of the decision: when no attempt could have reached Redis, nothing changed (503
    SERVICE_UNAVAILABLE, retryable) and the balance is untouched."""
    from hotledger.ledger.feature import ledger

    user_id = api.account(balance="10.00")
    lua = proxied_lua(settings, proxy)
    proxy.close()
    through_proxy(monkeypatch, ledger().store, lua)
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"})
    monkeypatch.undo()
    assert (status, body["error"]["code"]) == (503, "SERVICE_UNAVAILABLE"), body
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "10.00"
