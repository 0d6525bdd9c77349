"""Webhooks: endpoints subscribe to event types; every durable change of a subscribed type is delivered to them,
signed per Standard Webhooks 1.0, in order per account per endpoint, with retries for 3 days.

- Events come from the durable log only: one event row is written in the transaction that books the ledger entry
  (webhooks.store.enqueue), whatever the number of endpoints, never on the request path, so an event exists exactly
  when its change is in the DB; the sender fans it out to each subscribed endpoint's deliveries in transactions of its
  own (WebhookStore.fan_out), never the booking's.
- At most WEBHOOK_MAX_ENDPOINTS (16, as Stripe) endpoints live at once (the stack is one tenant): each multiplies every
  event.
- Each carries event_id (stable: the receiver's de-duplication key), type, the account's seq and prev_seq (the seq of
  the previous event of that account for that endpoint): a receiver checks the order and sees a gap.
- Headers webhook-id, webhook-timestamp and webhook-signature ('v1,<base64 HMAC-SHA256 of id.timestamp.body>'; during
  a secret rotation's overlap one signature per secret, space-separated: each old secret signs until its own overlap
  ends, or a later rotation's if that ends sooner, at most MAX_OLD_SECRETS at once); secrets are 'whsec_<base64>'.
- In order per account per endpoint: an account's due PENDING deliveries for an endpoint are sent one after another
  in (seq, sub_seq) order from its first PENDING one, and the first that fails ends that account's run: a retry holds
  back the ones after it (of that account and endpoint alone). Each endpoint is sent to by its own worker with a
  short timeout, so a slow or dead endpoint never delays the others (nor the writer: it only wrote rows).
- Retries: exponential backoff with jitter, from 5 s up to an hour, for 3 days; then the event is dead-lettered (DEAD)
  and the endpoint flagged `failing`. GET .../deliveries shows attempts and answers; POST .../replay sends again.
- Where it may send: https only (http://127.0.0.1 and localhost too with WEBHOOK_ALLOW_LOCAL, for local receivers), and
  never to a host that resolves to a private, loopback, link-local, reserved, NAT64, 6to4 or metadata address, checked at
  delivery time too (DNS can change after the endpoint was registered), and the attempt connects to an address that
  check answered (pinned: DNS rebinding cannot reach a private address), TLS verified against the host name.
- Any error of one attempt (a refused connection, a receiver answering garbage, a URL http.client cannot send) is that
  attempt's failure, retried like a 500: it never ends the sending of the others.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import hashlib
import hmac
import http.client
import ipaddress
import json
import random
import re
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Protocol, TypedDict
from urllib.parse import urlsplit

from hotledger import errors, observability
from hotledger.webhooks.events import ALL_TYPES
from hotledger.webhooks.secrets import SecretBox
from hotledger.webhooks.store import FAN_OUT_BATCH, EndpointChange, Key, WebhookStore, by_endpoint, runs
from hotledger.webhooks.store import Delivery as Delivery  # re-exported: what the routes show
from hotledger.webhooks.store import Endpoint as Endpoint

logger = observability.logger()

RETRY_FOR_MS = 3 * 86_400_000
FIRST_RETRY_MS, LONGEST_RETRY_MS = 5_000, 3_600_000
# One wall-clock deadline per attempt, from its start (name resolution, connect to each checked address in turn, TLS,
# the request, the answer's head) to the answer's status: a receiver trickling bytes cannot stretch it. 15 s, the low
# end of the 15-30 s Standard Webhooks suggests: receivers are told to acknowledge first and work afterwards, so a
# receiver needing longer is broken for the purpose, and a hanging endpoint's worker is back within 15 s. An attempt
# started less than 15 s before its run's end gets what is left, at least LAST_ATTEMPT_S (send_due: end_by), so every
# attempt started ends, and is recorded, before the scheduled sender's own timeout (webhook_sender/app.py) without
# leaving a long gap between runs.
SEND_TIMEOUT_S = 15.0
LAST_ATTEMPT_S = 5.0
SEND_WORKERS = 16  # endpoints sent to at once
ROTATION_OVERLAP_S = 86_400
REPLAY_PAGE, REPLAY_PAGE_MAX = 500, 1000  # deliveries one replay call reads and changes, by default and at most
TOLERANCE_S = 300  # what receivers allow between webhook-timestamp and their clock (the standard's 5 minutes)


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def signatures(event_id: str, timestamp: int, body: str, keys: list[str]) -> str:
    """Standard Webhooks 1.0: 'v1,<base64(HMAC-SHA256(secret, id.timestamp.body))>' per secret, space-separated."""
    signed = f"{event_id}.{timestamp}.{body}".encode()
    return " ".join(
        "v1,"
        + base64.b64encode(
            hmac.new(base64.b64decode(key.removeprefix("whsec_")), signed, hashlib.sha256).digest()
        ).decode()
        for key in keys
    )


def next_attempt(attempts: int, now_ms: int, created_at: int, not_before: int = 0) -> int | None:
    """When to try again after `attempts` failed ones (exponential, full jitter on the upper half; never before
    not_before, a 429's Retry-After), or None past 3 days."""
    delay = min(LONGEST_RETRY_MS, FIRST_RETRY_MS * 2 ** min(attempts, 20))
    at = max(not_before, now_ms + int(delay / 2 + random.random() * delay / 2))
    return at if at < created_at + RETRY_FOR_MS else None


def retry_after_ms(value: str | None, now_ms: int) -> int:
    """A Retry-After header (delay seconds or an HTTP date) as epoch ms; 0 when absent or unreadable."""
    if not value:
        return 0
    value = value.strip()
    if value.isdigit():
        return now_ms + int(value) * 1000
    try:
        return int(email.utils.parsedate_to_datetime(value).timestamp() * 1000)
    except (TypeError, ValueError, IndexError, OverflowError):
        return 0


class Resolve(Protocol):
    """socket.getaddrinfo's shape, as check_url calls it: each answer's last field starts with the address."""

    def __call__(self, host: str, port: int, *, proto: int) -> Iterable[tuple[int, int, int, str, tuple[Any, ...]]]: ...


def check_url(url: str, allow_local: bool, resolve: Resolve | None = None) -> list[str]:
    """Refuses (InvalidWebhookUrl) what the endpoint may not be: not https (but local http with allow_local), a
    character a request line cannot carry, or a host resolving to a private, loopback, link-local, reserved,
    multicast, NAT64, 6to4 or metadata address. Returns the addresses it checked: the sender connects to those and no
    others (pinned: a name answering a public address to this check and a private one to the connection, DNS
    rebinding, never reaches the private one)."""
    if not _SENDABLE.fullmatch(url):
        raise errors.InvalidWebhookUrl(
            "an endpoint's url is printable ASCII without spaces or control characters: percent-encode the path and"
            " query (/caf\u00e9 as /caf%C3%A9, a space as %20) and write an international host name in its xn-- form"
        )
    parts = urlsplit(url)
    local = allow_local and parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost")
    if parts.scheme != "https" and not local:
        raise errors.InvalidWebhookUrl("an endpoint's url is https (http://127.0.0.1 only for local receivers)")
    if not parts.hostname or parts.username or parts.password:
        raise errors.InvalidWebhookUrl("an endpoint's url names a host, without credentials")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise errors.InvalidWebhookUrl("an endpoint's url has a port from 1 to 65535") from exc
    if local:
        return [parts.hostname]  # loopback by its name: nothing to pin
    try:
        answers = (resolve or socket.getaddrinfo)(parts.hostname, port, proto=socket.IPPROTO_TCP)
        addresses = list(dict.fromkeys(str(info[4][0]) for info in answers))
    except (OSError, UnicodeError) as exc:
        raise errors.InvalidWebhookUrl(f"{parts.hostname} does not resolve") from exc
    if not addresses or not all(_public(address) for address in addresses):
        # which address it is stays unsaid: the answer would make this a lookup service for private DNS names
        raise errors.InvalidWebhookUrl(
            f"{parts.hostname} resolves to an address that is not a public address (private, loopback,"
            " link-local, reserved or metadata)"
        )
    return addresses


# is_global counts these as public, but each reaches an IPv4 address embedded in it, private ones included: NAT64
# (RFC 6052's well-known prefix, RFC 8215's local-use one) and 6to4 (RFC 3056)
_TRANSLATED = tuple(ipaddress.ip_network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48", "2002::/16"))
_METADATA = ("169.254.169.254", "fd00:ec2::254")


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    return (
        ip.is_global
        and not ip.is_reserved  # is_global counts IPv6's reserved ranges (4000::/3, ...) in
        and not ip.is_multicast
        and address not in _METADATA
        and not any(ip.version == 6 and ip in net for net in _TRANSLATED)
    )


_SENDABLE = re.compile(r"[\x21-\x7e]+")  # what an HTTP request line carries as is (http.client refuses the rest)


class Webhooks:
    def __init__(
        self,
        store: WebhookStore,
        allow_local: bool,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
        max_endpoints: int = 16,
        box: SecretBox | None = None,
    ):
        self.store, self.allow_local, self.clock, self.max_endpoints = store, allow_local, clock, max_endpoints
        self.box = box or SecretBox(None)  # signing secrets at rest: sealed by create and rotate, opened to sign
        # how one signed attempt is sent (the request, its timeout_s) and answered: here by default
        self.post: Post = lambda request: attempt(request, self.allow_local)

    # endpoints ----------------------------------------------------------------------------------------------------
    def create(
        self, url: str, event_types: list[str], description: str, operator: bool = True, actor: str = ""
    ) -> tuple[Endpoint, str]:
        """Registers an endpoint; one an operator creates (operator) only operators may change (changeable)."""
        check_url(url, self.allow_local)
        types = _types(event_types)
        secret = new_secret()
        endpoint_id = self.store.create(
            url, types, description, self.box.seal(secret), self.clock(), operator, actor, self.max_endpoints
        )
        if endpoint_id is None:
            raise errors.WebhookEndpointLimit(
                f"at most {self.max_endpoints} webhook endpoints (WEBHOOK_MAX_ENDPOINTS): delete one first"
            )
        return self.get(endpoint_id), secret

    def changeable(self, endpoint_id: int, operator: bool) -> Endpoint:
        """The endpoint, if this caller may change it: an operator's endpoint only by operators (a service caller gets
        403 FORBIDDEN), a service's by services and operators."""
        endpoint = self.get(endpoint_id)
        if endpoint.operator_owned and not operator:
            raise errors.Forbidden(
                f"webhook endpoint {endpoint_id} was created by an operator: only operators change it"
            )
        return endpoint

    def get(self, endpoint_id: int) -> Endpoint:
        found = self.store.endpoint(endpoint_id)
        if found is None:
            raise errors.WebhookEndpointNotFound(f"webhook endpoint {endpoint_id} does not exist")
        return found

    def endpoints(self) -> list[Endpoint]:
        return self.store.endpoints()

    def update(
        self,
        endpoint_id: int,
        url: str | None,
        event_types: list[str] | None,
        description: str | None,
        enabled: bool | None,
    ) -> Endpoint:
        self.get(endpoint_id)
        fields: EndpointChange = {}
        if url is not None:
            check_url(url, self.allow_local)
            fields["url"] = url
        if event_types is not None:
            fields["event_types"] = _types(event_types)
        if description is not None:
            fields["description"] = description
        if enabled is not None:
            fields["enabled"] = int(enabled)
            if enabled:
                fields["failing"] = 0
        self.store.update(endpoint_id, **fields)
        return self.get(endpoint_id)

    def rotate(self, endpoint_id: int, overlap_s: int) -> str:
        self.get(endpoint_id)
        secret = new_secret()
        now = self.clock()
        self.store.rotate(endpoint_id, self.box.seal(secret), now, now + overlap_s * 1000)
        return secret

    def seal_clear_secrets(self) -> tuple[int, list[int]]:
        """Seals, in place, every secret kept as it is from before the sealing (current and old ones, deleted endpoints'
        too): the same secrets sign, none is kept in clear. Once: a sealed secret is left as it is, so running it again
        seals nothing. Returns how many secrets were sealed, and in which endpoints."""
        if self.box.key_id is None:
            raise errors.NoSealingKey("WEBHOOK_SECRETS_KEY_ID is not set: there is no key to seal the secrets with")
        box = self.box
        sealed = {
            e: self.store.reseal(e, lambda s: s if box.sealed(s) else box.seal(s))
            for e in self.store.holding_clear_secrets()
        }
        return sum(sealed.values()), [e for e, n in sealed.items() if n]

    def delete(self, endpoint_id: int) -> None:
        self.get(endpoint_id)
        self.store.update(endpoint_id, deleted=1, enabled=0)

    def deliveries(
        self, endpoint_id: int, state: str | None, limit: int, before: tuple[int, int, int, int] | None = None
    ) -> list[Delivery]:
        self.get(endpoint_id)
        return self.store.deliveries(endpoint_id, state, limit, before)

    def replay(
        self,
        endpoint_id: int,
        since_seq: int | None,
        since_ms: int | None,
        user_id: int | None,
        after: Key | None = None,
        limit: int = REPLAY_PAGE,
    ) -> tuple[int, Key | None]:
        """One page of a replay (WebhookStore.replay): how many were sent again, and where the next page starts."""
        self.get(endpoint_id)
        return self.store.replay(endpoint_id, self.clock(), since_seq, since_ms, user_id, after, limit)

    def dead_letters(self, limit: int) -> list[Delivery]:
        return self.store.dead(limit)

    def replay_dead(self, endpoint_id: int | None) -> int:
        """Dead-lettered deliveries sent again, in their order (once: a second replay finds none)."""
        if endpoint_id is not None:
            self.get(endpoint_id)
        return self.store.revive_dead(endpoint_id, self.clock())

    # sending ------------------------------------------------------------------------------------------------------
    def send_due(self, batch: int = 200, seconds: float = 50.0, idle_wait_s: float | None = None) -> dict[str, int]:
        """Sends until nothing due is left (with idle_wait_s: waiting up to that long and looking again) or `seconds` ran
        out. Each endpoint with due deliveries (WebhookStore.due: per account, its run of due ones from its first
        PENDING one, `batch` in all) gets a worker of its own and is looked at again as soon as that worker is done,
        while the other endpoints go on: a slow or hanging endpoint holds back only its own events. Returns counts of
        delivered, retried, dead-lettered and disabled (an endpoint answering 410 Gone is disabled)."""
        counts = {"delivered": 0, "retried": 0, "dead": 0, "disabled": 0}
        stop_at = time.monotonic() + seconds
        busy: dict[Future[list[str]], int] = {}  # a worker -> its endpoint
        with ThreadPoolExecutor(max_workers=SEND_WORKERS) as pool:
            while time.monotonic() < stop_at:
                # what the bookings wrote becomes each endpoint's deliveries (outside the booking transactions)
                while self.store.fan_out() == FAN_OUT_BATCH and time.monotonic() < stop_at:
                    pass
                due = {
                    e: d
                    for e, d in by_endpoint(self.store.due(self.clock(), batch, set(busy.values()))).items()
                    if e not in busy.values()
                }
                endpoints = {e.endpoint_id: e for e in self.store.endpoints() if e.endpoint_id in due}
                for endpoint_id, deliveries in due.items():
                    endpoint = endpoints.get(endpoint_id)
                    if endpoint is not None and endpoint.enabled:  # else deleted or disabled: replay or enable sends
                        busy[pool.submit(self._send_endpoint, endpoint, deliveries, stop_at)] = endpoint_id
                if not busy:
                    if idle_wait_s is None:
                        break  # what is left waits for its next attempt
                    time.sleep(min(idle_wait_s, max(0.0, stop_at - time.monotonic())))
                    continue
                done, _ = wait(busy, timeout=idle_wait_s, return_when=FIRST_COMPLETED)
                for worker in done:
                    del busy[worker]
                    for outcome in worker.result():
                        counts[outcome] += 1
            for worker in list(busy):
                for outcome in worker.result():
                    counts[outcome] += 1
        return counts

    def _send_endpoint(self, endpoint: Endpoint, deliveries: list[Delivery], stop_at: float) -> list[str]:
        """The endpoint's deliveries, account by account, each account's run one after another in its order until one
        fails (retried or dead-lettered): the rest of that run stays PENDING, untouched, behind it. None starts past
        stop_at (those stay due); each ends by the earlier of its SEND_TIMEOUT_S and stop_at + LAST_ATTEMPT_S."""
        outcomes: list[str] = []
        for run in runs(deliveries):
            tried = 0
            try:
                for d in run:
                    if time.monotonic() >= stop_at:
                        return outcomes
                    tried += 1
                    outcomes.append(self._send(endpoint, d, stop_at + LAST_ATTEMPT_S))
                    if outcomes[-1] == "disabled":
                        return outcomes  # 410 Gone: nothing more to this endpoint until it is enabled again
                    if outcomes[-1] != "delivered":
                        break
            finally:
                if tried:  # its account's head moves on to what is PENDING now (or goes)
                    self.store.advance(endpoint.endpoint_id, run[0].user_id)
        return outcomes

    def _send(self, endpoint: Endpoint, d: Delivery, end_by: float) -> str:
        now = self.clock()
        timestamp = now // 1000
        started = time.monotonic()
        deadline = min(started + SEND_TIMEOUT_S, end_by)
        try:
            signature = signatures(
                d.event_id, timestamp, d.payload, [self.box.open(sealed) for sealed in endpoint.secrets(now)]
            )
        except Exception as exc:  # a secret that cannot be opened now: this attempt failed, not the whole pass
            answer: Attempt = {"status": None, "error": f"not signed: {type(exc).__name__}: {exc}"}
            logger.warning("webhook delivery not signed", extra={"endpoint_id": endpoint.endpoint_id, **answer})
        else:
            headers = {
                "content-type": "application/json",
                "webhook-id": d.event_id,
                "webhook-timestamp": str(timestamp),
                "webhook-signature": signature,
                "user-agent": "hotledger-webhooks/1",
            }
            # signed here, sent by self.post: in this process, or (WEBHOOK_POSTER_FUNCTION) by the poster function
            # outside the VPC; either way an Attempt, whatever went wrong
            answer = self.post(
                {"url": endpoint.url, "headers": headers, "body": d.payload, "timeout_s": deadline - started}
            )
        status, error, retry_after = answer.get("status"), answer.get("error") or "", answer.get("retry_after")
        if status is not None and 200 <= status < 300:
            self.store.delivered(d, status, self.clock())
            return "delivered"
        if status == 410:  # Gone (Standard Webhooks): the endpoint is disabled; this event waits for it with the rest
            self.store.gone(d, "HTTP 410: the endpoint is gone, disabled (enable it to send again)", self.clock())
            return "disabled"
        now = self.clock()
        not_before = retry_after_ms(retry_after, now) if status in (429, 503) else 0
        retry_at = next_attempt(d.attempts, now, d.retry_from or d.created_at, not_before)
        self.store.failed(d, status, error or f"HTTP {status}", retry_at)
        return "retried" if retry_at else "dead"


class Attempt(TypedDict, total=False):
    """What one attempt came to: the answer's status (and Retry-After), or the error that ended it."""

    status: int | None
    retry_after: str | None
    error: str


class Request(TypedDict):
    """One signed attempt, as the sender hands it over: no secret in it, only its signatures."""

    url: str
    headers: dict[str, str]
    body: str
    timeout_s: float


Post = Callable[[Request], Attempt]


def attempt(request: Request, allow_local: bool) -> Attempt:
    """One attempt, within one deadline of request['timeout_s'] from now: the url checked (and its addresses pinned)
    where it connects, then posted. Any error is the attempt's failure, told in `error` (never raised)."""
    started = time.monotonic()
    deadline = started + max(0.0, float(request["timeout_s"]))
    try:
        # checked again (DNS can change after registration), within the attempt's deadline
        resolving = _RESOLVING.submit(check_url, request["url"], allow_local)
        addresses = resolving.result(timeout=max(0.0, deadline - time.monotonic()))
        status, retry_after = _post(request["url"], addresses, request["body"].encode(), request["headers"], deadline)
        return {"status": status, "retry_after": retry_after}
    except errors.InvalidWebhookUrl as exc:
        return {"error": exc.message}
    except TimeoutError:
        return {"error": f"no answer within {deadline - started:.3g} s (one deadline for the whole attempt)"}
    except Exception as exc:  # any error of one attempt (BadStatusLine, InvalidURL, ...) is its failure
        return {"error": _describe(exc)}


def lambda_poster(function_name: str) -> Post:
    """Each attempt sent by the poster function (functions/webhook_poster, outside the VPC: the stack's VPC has no NAT),
    invoked through Lambda's API (an interface endpoint in the VPC); a failed invoke is the attempt's failure."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "lambda", config=Config(read_timeout=SEND_TIMEOUT_S + 15, connect_timeout=5, retries={"max_attempts": 0})
    )

    def post(request: Request) -> Attempt:
        try:
            answer = client.invoke(FunctionName=function_name, Payload=json.dumps(request).encode())
            if answer.get("FunctionError"):
                return {"error": f"the poster failed: {answer['Payload'].read()[:300]!r}"}
            result: Attempt = json.loads(answer["Payload"].read())
            return result
        except Exception as exc:
            return {"error": f"the poster could not be invoked: {_describe(exc)}"}

    return post


_RESOLVING = ThreadPoolExecutor(max_workers=SEND_WORKERS, thread_name_prefix="webhook-dns")  # bounded by the deadline
_TLS = ssl.create_default_context()  # the certificate is checked against the url's host name (and SNI names it)


def _post(
    url: str, addresses: list[str], body: bytes, headers: dict[str, str], deadline: float
) -> tuple[int, str | None]:
    """POSTs to the url's host name at one of `addresses` (those check_url checked, tried in turn), never at another
    address the name may resolve to by now; TLS still names and verifies the host name. No redirect is followed (a 3xx
    is a failed attempt: it could lead where the check refused). All of it by `deadline` (time.monotonic()): then the
    socket is shut, whatever the receiver is sending (TimeoutError). Returns the answer's status and Retry-After."""
    parts = urlsplit(url)
    host, port = str(parts.hostname), parts.port or (443 if parts.scheme == "https" else 80)
    left = max(0.001, deadline - time.monotonic())
    conn = (
        http.client.HTTPSConnection(host, port, timeout=left, context=_TLS)
        if parts.scheme == "https"
        else http.client.HTTPConnection(host, port, timeout=left)
    )
    opened: list[socket.socket] = []
    expired = threading.Event()

    def pinned(address: tuple[str, int], timeout: float, source: tuple[str, int] | None = None) -> socket.socket:
        failure: OSError = OSError(f"{host} has no address to connect to")
        for ip in addresses:
            if expired.is_set() or time.monotonic() >= deadline:
                raise TimeoutError
            try:
                sock = socket.create_connection((ip, port), max(0.001, deadline - time.monotonic()), source)
            except OSError as exc:
                failure = exc
                continue
            opened.append(sock)
            if expired.is_set():  # the deadline passed while connecting
                _shut(sock)
                raise TimeoutError
            return sock
        raise failure

    def expire() -> None:
        expired.set()
        for sock in opened:
            _shut(sock)  # wakes the worker blocked on it: the attempt ends now

    conn._create_connection = pinned  # type: ignore[attr-defined]  # http.client's own hook for opening the socket
    timer = threading.Timer(max(0.0, deadline - time.monotonic()), expire)
    timer.daemon = True
    timer.start()
    try:
        conn.request("POST", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), body, headers)
        answer = conn.getresponse()
        if expired.is_set():  # the shut socket read as the end of the head: an answer cut off, not one given
            raise TimeoutError
        return answer.status, answer.getheader("retry-after")
    except Exception:
        if expired.is_set():
            raise TimeoutError from None
        raise
    finally:
        timer.cancel()
        conn.close()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _describe(exc: BaseException) -> str:
    """An attempt's error as last_error shows it: the exception's type and what it says (a URLError its reason)."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, BaseException):
        exc = reason
    text = str(reason if isinstance(reason, str) else exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _types(event_types: list[str]) -> list[str]:
    unknown = sorted(set(event_types) - ALL_TYPES)
    if unknown or not event_types:
        raise errors.InvalidWebhookTypes(
            f"event_types: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(sorted(ALL_TYPES))}"
        )
    return sorted(set(event_types))
