"""The parts of docs/ that the code states: the route table and the error codes (docs/api.md) and every setting
(docs/configuration.md), written between their markers so they cannot drift from the code.

    python infra/gen_docs.py          rewrite the generated sections
    python infra/gen_docs.py --check  exit 1 when a generated section is stale (tests/unit/test_docs.py runs this)

What a code or a setting means is written here, once, beside what the code says of it (status, default, variable,
whether SSM may tune it): a code or setting without a description here fails the generator, so a new one cannot
reach the docs undescribed."""

from __future__ import annotations

import argparse
import ast
import re
import sys
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"

# what each error code means to a caller; the status and where it is raised come from the code
ERROR_WHEN = {
    "MALFORMED_JSON": "the body is not JSON",
    "UNSUPPORTED_MEDIA_TYPE": "a body sent without `Content-Type: application/json`",
    "MISSING_FIELD": "a required field is absent",
    "INVALID_GRANT": "a recharge's grant.expires_at is not in the future (a grant on a deduct, or a category not "
    "matching ^[a-z][a-z0-9_-]{0,31}$, is a VALIDATION_ERROR)",
    "INVALID_AMOUNT": "an amount (amount, threshold, total, monitor lines) is not a decimal string, has more "
    "fractional digits than the account's currency (JPY 0, USD 2, KWD 3: `1.5` is refused for a JPY account, `1.234` "
    "for a USD one, trailing zeros count), is <= 0, has more than 12 whole digits, has an exponent or is NaN",
    "VALIDATION_ERROR": "a wrong type, an unknown field, a bad name, id, filter or event type",
    "ROUTE_NOT_FOUND": "no such route",
    "METHOD_NOT_ALLOWED": "the route exists but not with this method; the `Allow` header lists its methods",
    "UNAUTHENTICATED": "no bearer token, or an invalid or expired one (every route but `/openapi.json` and `/swagger`)",
    "FORBIDDEN": "this caller may not make this request ([who may call what](api.md#who-may-call-what)); nothing changed",
    "ACCOUNT_NOT_FOUND": "no such account",
    "ORDER_NOT_FOUND": "no such charge of this account, or no such payment order (also for another user's order)",
    "DUPLICATE_USER_NAME": "an account with this `user_name` exists",
    "INSUFFICIENT_BALANCE": "`available - amount < threshold` (a capture: also when it would take what grants that expired "
    "while its hold was open held; a transfer: `available` less the payer's live grants, as it moves plain money only)",
    "API_CLOSED": "the account's API is closed: balance exhausted, or closed by an operator",
    "BALANCE_LIMIT": "the balance would pass 90,000,000,000,000.00 (Lua's doubles stay exact below 2^53)",
    "IDEMPOTENCY_KEY_REUSED": "the Idempotency-Key was used with another body or on another route",
    "IDEMPOTENCY_IN_PROGRESS": "another attempt under this Idempotency-Key is still running; retry later",
    "PENDING_ORDERS": "switching to SYNC while charges are still on their way to the DB",
    "PUBLISH_FAILED": "the broker did not acknowledge: nothing was charged; retry with the same Idempotency-Key",
    "SERVICE_UNAVAILABLE": "Redis, the DB or the lock is unavailable (the request cannot have reached it, or the "
    "request was a GET), or the authorizer cannot read the JWKS: nothing changed; retry",
    "LOCK_LOST": "the request's account lock ran out and a newer holder wrote first (fencing): nothing changed; retry",
    "OUTCOME_UNKNOWN": "the change may stand: `error.entry_id` (or `packet_id`, `transfer_id`) names it; look it up, or "
    "retry with the same Idempotency-Key, which answers its real outcome. Without an id: Redis or the DB did not "
    "answer after the request reached it (a delay-queue ack, a webhook endpoint's creation, ...); read the resource "
    "before retrying (an Idempotency-Key answers IDEMPOTENCY_IN_PROGRESS until its first attempt's lease ends)",
    "VOUCHER_NOT_FOUND": "no such voucher",
    "SALE_NOT_STARTED": "before the voucher's `begin_at`",
    "SALE_ENDED": "after the voucher's `end_at`",
    "SOLD_OUT": "no stock left",
    "ALREADY_ORDERED": "this user holds `per_user_limit` orders of this voucher",
    "RECOVERING": "Redis lost the voucher, packet or account and it was rebuilt from the DB: orders, grabs, charges "
    "under an Idempotency-Key the account does not know, and debits that would spend its credit grants wait until those acknowledged before the loss are in the DB; "
    "nothing changed; retry after `error.retry_at`",
    "PACKET_NOT_FOUND": "no such red packet",
    "TRANSFER_NOT_FOUND": "no such transfer (or, to an end user, one they did not pay)",
    "SAME_ACCOUNT": "a transfer's `from` and `to` are the same account; nothing changed",
    "CURRENCY_MISMATCH": "a transfer between accounts of different currencies, or a grab of a red packet sent in "
    "another currency than the grabber's; nothing changed",
    "ACCOUNT_CLOSED": "a transfer to an account an operator closed (`PATCH api_open: false`); nothing changed",
    "TRANSFER_FAILED": "the transfer this Idempotency-Key began failed (its debit was refused); nothing changed",
    "PACKET_NOT_OPEN": "the sender's debit failed or is not settled yet",
    "ALREADY_GRABBED": "this user grabbed from this packet already",
    "EMPTY": "every item of the packet is taken",
    "EXPIRED": "the packet is past its expiry",
    "TOTAL_TOO_SMALL": "a red packet total below count x 0.01",
    "HOLD_NOT_FOUND": "no such hold on this account",
    "HOLD_CAPTURED": "the hold ended captured (a capture or void after it)",
    "HOLD_VOIDED": "the hold ended voided",
    "HOLD_EXPIRED": "the hold ended expired",
    "HOLD_NOT_DUE": "an expiry asked of a hold before its `expires_at`",
    "CAPTURE_EXCEEDS_HOLD": "a capture of more than is left on the hold",
    "HOLD_BUSY": "a capture of the hold is still being made durable (milliseconds): nothing changed; retry",
    "REFUND_EXCEEDS_CHARGE": "the refunds would pass what was charged",
    "HOLD_NOT_ENDED": "a hold's captures are refundable once the hold ended",
    "CHARGE_NOT_BOOKED": "the charge is not in the ledger's books yet (a refund covers only what is booked): retry once "
    "its order is `PERSISTED` or its hold's end is booked; nothing changed",
    "NOT_REFUNDABLE": "the service's own charges (a red packet's debit, a payment order's charge) are given back by "
    "their own lifecycle, not by a refund",
    "WEBHOOK_ENDPOINT_NOT_FOUND": "no such webhook endpoint",
    "INVALID_WEBHOOK_URL": "not https (http://127.0.0.1 only with `WEBHOOK_ALLOW_LOCAL`), credentials in it, a character "
    "an HTTP request cannot carry (non-ASCII, a space or a control character: percent-encode the path and query), or a "
    "host resolving to a private, loopback, link-local or metadata address",
    "MONITOR_NOT_FOUND": "no such balance monitor on this account",
    "INVALID_MONITOR": "a re-arm line on the wrong side of the alert's, or more than 20 monitors on an account",
    "INVALID_CURSOR": "a cursor not handed out for this account and these filters",
    "WEBHOOK_ENDPOINT_LIMIT": "a webhook endpoint created while `WEBHOOK_MAX_ENDPOINTS` (16) live already: delete one first",
    "NO_SEALING_KEY": "`POST /ops/webhook-secrets/seal` on a stack without `WEBHOOK_SECRETS_KEY_ID` (the local runtime): nothing sealed",
    "INVALID_DEAD_LETTER_ID": "an operator's replay names a dead letter by an id of the wrong shape (or names any for the dead-letter topic, replayed whole)",
    "DEAD_LETTER_EXPIRED": "an operator's replay names a writer or stream dead letter older than the rollback records can still judge (`KEY_RETENTION_DAYS` less 8 days after it was set aside): nothing is replayed",
    "INVALID_RANGE": "`until` not after `since`",
    "STATEMENT_TOO_LARGE": "a statement over 1,000 entries (page `/entries` instead)",
    "BEFORE_LEDGER": "a balance or statement asked for before the account's opening entry (it held money before the ledger existed)",
    "ORDER_CLOSED": "the payment order is closed",
    "ORDER_PAID": "the payment order is paid",
    "ELEMENT_NOT_FOUND": "no such element in the delay queue (or its dead letters)",
    "JOURNEY_NOT_FOUND": "no such started journey",
    "QUEUE_RESERVED": "the service's own queues (`order-close-reminder`, `order-close`, `redpacket-expiry`, "
    "`hold-expiry`) are not open to HTTP",
    "QUEUE_FULL": "the delay queue holds `DELAY_MAX_QUEUE_SIZE` elements: nothing changed",
    "TOO_MANY_PENDING": "the account has `MAX_PENDING_ENTRIES` charges not yet in the DB: nothing changed; retry",
    "TOO_MANY_KEYS": "the caller opened `MAX_IDEMPOTENCY_KEYS` new Idempotency-Keys this 24 h window; its keys still "
    "answer",
}

# what each setting is for; its variable, default and SSM tunability come from hotledger/config.py
SETTING_WHAT = {
    "redis_url": "Redis to use; in AWS `rediss://<configuration endpoint>:6379`",
    "redis_password": "Redis AUTH password (in AWS read from the secret `REDIS_AUTH_SECRET_ARN`)",
    "redis_username": "an ElastiCache RBAC user (`AUTH <user> <password>`); unset: the default user",
    "redis_cluster": "`1`: `REDIS_URL` names Redis Cluster seed nodes (the ElastiCache configuration endpoint, or "
    "several nodes comma-separated, `redis+cluster://h1:7000,h2:7001`: a process starts while any one lives); a "
    "`redis+cluster://` or `rediss+cluster://` URL says the same",
    "db_host": "MySQL host (in AWS the RDS Proxy endpoint)",
    "db_port": "MySQL port",
    "db_user": "MySQL user (in AWS from the DB secret)",
    "db_password": "MySQL password (in AWS from the DB secret)",
    "db_name": "MySQL schema",
    "db_secret_arn": "a JSON secret (`username`, `password`, optional `host`, `port`, `dbname`); read again once, past "
    "the cache, when a login is refused (rotation does not break warm functions)",
    "db_tls": "`verify`: TLS, chain and host name checked against `DB_CA_BUNDLE`; `off`: plain (local)",
    "db_ca_bundle": "`certifi` (the Amazon Root CAs that sign RDS Proxy's certificates) or a PEM path (the RDS global "
    "bundle for a direct RDS/Aurora endpoint)",
    "secrets_max_age_s": "how long Secrets Manager values are cached per container",
    "kafka_bootstrap": "Kafka brokers (MSK IAM brokers, port 9098, in AWS)",
    "kafka_topic": "the event topic (its dead letters go to `<topic>.dead-letter`)",
    "kafka_security_protocol": "the protocol, used only with `KAFKA_AUTH=none`",
    "kafka_auth": "`iam`: SASL_SSL + OAUTHBEARER with the function's role (MSK Serverless accepts only this); `none`",
    "aws_region": "the region of the AWS calls and of the MSK IAM token (Lambda sets it)",
    "publish_timeout_s": "how long a charge waits for the broker's acknowledgement",
    "event_keys_secret_arn": "the keyring secret that signs Kafka events (the stack creates it)",
    "event_keys": "the keyring itself as JSON (locally: `.state/event-keys.json`, passed by the local runtime)",
    "event_keys_max_age_s": "how long the keyring is cached; an unknown key id makes the writer read it again once",
    "entry_ttl_s": "how long an entry string lives in Redis",
    "idempotency_ttl_s": "how long Redis keeps an Idempotency-Key's record (the DB keeps it `KEY_RETENTION_DAYS`), "
    "and the key quota's window",
    "reconcile_age_s": "pending age after which the reconciler persists an entry, order or claim itself",
    "reconcile_part_items": "each reconciler part's item budget per run (the next run goes on from its cursor)",
    "reconcile_part_s": "each reconciler part's time budget per run",
    "reconcile_page": "accounts (vouchers, packets) the reconciler reads per page",
    "reconcile_pending_limit": "pending entries one account's check reads at most per run",
    "lock_ttl_ms": "the distributed lock's lease (renewed by the watchdog while held)",
    "lock_wait_ms": "how long a caller waits for the lock",
    "lua_dir": "where the Lua scripts are (`layers/lua` locally, the layer in AWS)",
    "event_transport": "`kafka` (MSK) or `redis-stream` (template parameter `EventTransport`)",
    "stream_shards": "Redis Streams transport: streams `events:{s0}`...; more shards spread them over more slots",
    "stream_group": "Redis Streams transport: the consumer group",
    "stream_batch": "Redis Streams transport: XREADGROUP COUNT",
    "stream_block_ms": "Redis Streams transport: XREADGROUP BLOCK (keep it under the 2 s socket timeout)",
    "stream_claim_idle_ms": "Redis Streams transport: reclaim entries idle this long (a dead drainer's)",
    "stream_max_deliveries": "Redis Streams transport: after this many deliveries an entry that still fails alone "
    "moves to `events:dead:{s<n>}`",
    "rebuild_hold_s": "the least a voucher or packet rebuilt after a Redis loss refuses orders and grabs, and a rebuilt "
    "account charges under Idempotency-Keys it does not know (`RECOVERING`; with Kafka at least `PUBLISH_TIMEOUT_S`, then until the writer applied the log)",
    "finished_keys_ttl_s": "how long Redis keeps an ended sale's or a finished packet's keys",
    "delay_visibility_ms": "how long a taken delay-queue element may go unacknowledged",
    "delay_max_deliveries": "deliveries after which a failing element moves to its queue's dead letters (0: never)",
    "delay_retry_base_ms": "a failed delivery comes back after base x 2^(n-1) ms",
    "delay_retry_cap_ms": "the cap of that backoff",
    "reminder_before_close_s": "an order-close reminder's lead time",
    "inbox_ttl_s": "an inbox message's lifetime",
    "inbox_max_messages": "an inbox's index is trimmed to this many messages",
    "delay_max_queue_size": "a client delay queue's elements, waiting + taken (`QUEUE_FULL`)",
    "max_pending_entries": "an account's charges in Redis not yet in the DB (`TOO_MANY_PENDING`)",
    "max_idempotency_keys": "new Idempotency-Keys per caller and window (`TOO_MANY_KEYS`)",
    "idempotency_lease_ms": "how long an attempt holds its route key; above the API function's timeout",
    "key_retention_days": "how long the DB keeps Idempotency-Key answers and rollback records (`t_idempotency`, "
    "`t_route_key`, `t_rolled_back`); keep it above the topic's retention",
    "webhook_retention_days": "how long the DB keeps a `DELIVERED` or `DEAD` webhook delivery (from its last attempt) "
    "and a balance monitor's crossing posted to the inbox; the reconciler prunes older ones and a deleted endpoint's",
    "webhook_max_endpoints": "live webhook endpoints at most (`WEBHOOK_ENDPOINT_LIMIT` past it; Stripe: 16)",
    "webhook_poster_function": "the function that makes the webhook sender's HTTP POSTs outside the VPC (the "
    "template sets it); empty: the sender posts itself",
    "webhook_secrets_key_id": "the KMS key webhook signing secrets are sealed under at rest (envelope; the "
    "template sets it); empty: kept in clear (local only)",
    "default_currency": "the ISO 4217 currency of an account created without one, and of every account created "
    "before currencies (their `t_account.currency` is NULL); changing it changes theirs, so set it once",
    "webhook_allow_local": "`1`: webhook endpoints may also be `http://127.0.0.1` / `http://localhost` (local "
    "receivers; never in AWS)",
    "journeys": "`biz=seconds,...`: unfinished journeys older than this become one inbox message",
}

OWNER_WORDS = "the account's own user"


def _begin(name: str) -> str:
    return f"<!-- BEGIN GENERATED {name}: infra/gen_docs.py writes this; do not edit by hand -->"


def _end(name: str) -> str:
    return f"<!-- END GENERATED {name} -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# errors ---------------------------------------------------------------------------------------------------------
def error_codes() -> dict[str, set[int]]:
    """code -> the statuses it is answered with: every DomainError of hotledger.errors and every code the API
    function answers with itself (api/app.py: `_error(status, "CODE", ...)` and `code, status = "CODE", 422`)."""
    from hotledger import errors

    codes: dict[str, set[int]] = {}
    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, errors.DomainError) and value is not errors.DomainError:
            codes.setdefault(value.code, set()).add(value.status)
    tree = ast.parse((REPO / "functions" / "api" / "app.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_error" and len(node.args) >= 2:
            status, code = node.args[0], node.args[1]
            if isinstance(status, ast.Constant) and isinstance(code, ast.Constant):
                codes.setdefault(code.value, set()).add(status.value)
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Tuple)
            and isinstance(node.value, ast.Tuple)
        ):
            names = [getattr(t, "id", None) for t in node.targets[0].elts]
            if "code" in names and "status" in names:
                values = node.value.elts
                codes.setdefault(values[names.index("code")].value, set()).add(values[names.index("status")].value)
    return codes


def errors_table() -> str:
    codes = error_codes()
    undescribed, unknown = set(codes) - set(ERROR_WHEN), set(ERROR_WHEN) - set(codes)
    if undescribed or unknown:
        raise SystemExit(
            f"gen_docs: describe the new error codes {sorted(undescribed)} in ERROR_WHEN "
            f"(and drop the ones the code no longer has: {sorted(unknown)})"
        )
    rows = sorted(codes.items(), key=lambda item: (min(item[1]), item[0]))
    lines = ["| status | code | when |", "|---|---|---|"]
    lines += [
        f"| {', '.join(map(str, sorted(statuses)))} | `{code}` | {_cell(ERROR_WHEN[code])} |" for code, statuses in rows
    ]
    return "\n".join(lines)


# routes ---------------------------------------------------------------------------------------------------------
def routes() -> list[tuple[str, str, str, str]]:
    """(method, path as OpenAPI writes it, feature, handler name) for every route of the API function."""
    from api.app import app

    table = []
    for route in (*app._static_routes, *app._dynamic_routes):
        path = re.sub(r"<(\w+)>", r"{\1}", route.path)
        module = route.func.__module__
        feature = module.split(".")[1] if module.startswith("hotledger.") else "api"
        table.append((route.method, path, feature, route.func.__name__))
    return table


def who(rule) -> str:
    if rule.public:
        return "anyone, no token"
    if rule.anyone:
        return "any caller with a token"
    callers = sorted(rule.scopes)
    if rule.owner is not None:
        callers.append(OWNER_WORDS)
    return ", ".join(callers)


def routes_table() -> str:
    from api import authorization

    rules = {
        (method, re.sub(r"<(\w+)>", r"{\1}", path)): rule for (method, path), rule in authorization.rules().items()
    }
    lines = ["| method | path | feature | handler | who may call |", "|---|---|---|---|---|"]
    for method, path, feature, name in sorted(routes(), key=lambda r: (r[2], r[1], r[0])):
        lines.append(f"| {method} | `{path}` | {feature} | `{name}` | {who(rules[(method, path)])} |")
    return "\n".join(lines)


# settings -------------------------------------------------------------------------------------------------------
def _default(value) -> str:
    if value is None or value == "":
        return "unset"
    if isinstance(value, str) and value.startswith(str(REPO)):
        return "`layers/lua` (the repo's)"
    if isinstance(value, int) and value >= 3600 and value % 3600 == 0 and not isinstance(value, bool):
        hours = value // 3600
        return f"`{value}` ({hours // 24} days)" if hours % 24 == 0 else f"`{value}` ({hours} h)"
    return f"`{value}`"


def settings_table() -> str:
    from hotledger import config

    fields = config.Settings.model_fields
    undescribed = set(fields) - set(SETTING_WHAT)
    unknown = set(SETTING_WHAT) - set(fields)
    if undescribed or unknown:
        raise SystemExit(
            f"gen_docs: describe the new settings {sorted(undescribed)} in SETTING_WHAT "
            f"(and drop the ones config.py no longer has: {sorted(unknown)})"
        )
    lines = ["| variable | values | default | SSM tunable | what |", "|---|---|---|---|---|"]
    for name, f in fields.items():
        ssm = f"`{name}`" if name in config.SSM_TUNABLES else ""
        lines.append(
            f"| `{config.ENV[name]}` | {_values(f)} | {_default(f.default)} | {ssm} | {_cell(SETTING_WHAT[name])} |"
        )
    return "\n".join(lines)


def _values(field) -> str:
    """What a setting accepts, from its type and range in the settings model."""
    kind = field.annotation
    choices = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else ()
    if choices:
        return " or ".join(f"`{c}`" for c in choices)
    name = {int: "integer", float: "number", str: "text"}.get(kind, "text")
    bounds = [
        f"{symbol} {getattr(m, attr)}"
        for m in field.metadata
        for attr, symbol in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"))
        if hasattr(m, attr)
    ]
    return f"{name} {', '.join(bounds)}".strip()


SECTIONS = {  # name -> (file, the table's text)
    "routes": ("api.md", routes_table),
    "errors": ("api.md", errors_table),
    "settings": ("configuration.md", settings_table),
}


def rendered(text: str, name: str, body: str) -> str:
    pattern = re.compile(re.escape(_begin(name)) + r".*?" + re.escape(_end(name)), re.S)
    if not pattern.search(text):
        raise SystemExit(
            f"gen_docs: no markers for {name!r}; put these two lines where it goes:\n{_begin(name)}\n{_end(name)}"
        )
    return pattern.sub(lambda _: f"{_begin(name)}\n{body}\n{_end(name)}", text)


def regenerate() -> dict[Path, tuple[str, str]]:
    """path -> (text now, text generated)."""
    out: dict[Path, tuple[str, str]] = {}
    for name, (file, make) in SECTIONS.items():
        path = DOCS / file
        current = out[path][1] if path in out else path.read_text()
        out[path] = (out[path][0] if path in out else current, rendered(current, name, make()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated section is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, (now, generated) in regenerate().items():
        if now != generated:
            stale.append(path.relative_to(REPO))
            if not args.check:
                path.write_text(generated)
    if args.check and stale:
        print(f"stale generated docs: {', '.join(map(str, stale))}; run: python infra/gen_docs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
