"""hotledger ops: the operators' console. `make ops ARGS="..."` or `python -m infra.ops ...`.

Everything it does over HTTP goes through the API's admin routes with an operator's token (nothing bypasses the
authorizer): against the local stack by default (http://127.0.0.1:3000, a local dev-issuer token with the admin
scope), or against a deployed stack with --stack <name> (its outputs give the URL, the API key and the operator app
client; the token comes from Cognito with client credentials; your AWS credentials must be allowed to read them).

  dead-letters [--source S]       what is stuck, by source (writer, topic, stream, webhook, delay)
  replay SOURCE [ID ...]          replay dead letters (all not replayed yet, or those ids); idempotent, logged
  account USER_ID                 one account as the DB and Redis hold it, its pending entries, whether they agree
  reconciler                      each reconciler part: its cursor and last run (when, how long, failed, findings)
  log                             what operators did, newest first
  delay-queue QUEUE [--replay E]  a delay queue's dead elements; replay some
  rotate-webhook-secret ID        a new signing secret; the old one keeps signing for --overlap-s
  rotate-event-key --stack S      a new event-signing key in Secrets Manager (the previous one accepted for --grace-s)
  seal-webhook-secrets            once after upgrading: seal the webhook secrets kept in clear from before the sealing
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

LOCAL_API = "http://127.0.0.1:3000"
REPLAY_CHUNK = 500  # ids per replay request (the route's limit)
OPERATOR_HEADER = "X-Hotledger-Operator"  # read by api.authorization.principal_of
console = Console()


@dataclass(frozen=True)
class Target:
    base_url: str
    token: str
    api_key: str | None = None
    operator: str | None = None  # the person acting (their STS identity): the stack's token is one shared client's

    def call(self, method: str, path: str, body=None) -> tuple[int, object]:
        request = urllib.request.Request(
            self.base_url.rstrip("/") + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
                **({"x-api-key": self.api_key} if self.api_key else {}),
                **({OPERATOR_HEADER: self.operator} if self.operator else {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        return status, json.loads(raw) if raw else None

    def ok(self, method: str, path: str, body=None):
        status, answer = self.call(method, path, body)
        if status >= 400:
            error = (answer or {}).get("error", {}) if isinstance(answer, dict) else {}
            raise click.ClickException(
                f"{method} {path}: {status} {error.get('code', '')} {error.get('message', answer)}"
            )
        return answer


def stack_target(stack: str, cloudformation=None, apigateway=None, cognito=None, fetch_token=None) -> Target:
    """The deployed stack's API, its API key (REST front door) and an operator token (client credentials, scope
    hotledger/admin), and who is acting: the AWS identity these calls are made with (an SSO session's ARN ends with
    the person's name)."""
    import boto3

    operator = boto3.client("sts").get_caller_identity()["Arn"]

    outputs = {
        o["OutputKey"]: o["OutputValue"]
        for o in (cloudformation or boto3.client("cloudformation"))
        .describe_stacks(StackName=stack)["Stacks"][0]
        .get("Outputs", [])
    }
    api_key = None  # FrontDoor http: no API key (ApiKeyId is a REST front door's output)
    if "ApiKeyId" in outputs:
        api_key = (apigateway or boto3.client("apigateway")).get_api_key(apiKey=outputs["ApiKeyId"], includeValue=True)[
            "value"
        ]
    client = (cognito or boto3.client("cognito-idp")).describe_user_pool_client(
        UserPoolId=outputs["UserPoolId"], ClientId=outputs["OperatorClientId"]
    )["UserPoolClient"]
    token = (fetch_token or client_credentials_token)(outputs["TokenUrl"], client["ClientId"], client["ClientSecret"])
    return Target(outputs["ApiUrl"], token, api_key, operator)


def client_credentials_token(token_url: str, client_id: str, client_secret: str) -> str:
    body = urllib.parse.urlencode({"grant_type": "client_credentials", "scope": "hotledger/admin"}).encode()
    request = urllib.request.Request(
        token_url, data=body, method="POST", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    request.add_unredirected_header("Authorization", "Basic " + _basic(client_id, client_secret))
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["access_token"]


def _basic(user: str, password: str) -> str:
    import base64

    return base64.b64encode(f"{user}:{password}".encode()).decode()


@click.group(help=__doc__.split("\n\n")[0])
@click.option(
    "--api", "api_url", envvar="HOTLEDGER_API", default=LOCAL_API, show_default=True, help="the API's base URL"
)
@click.option("--token", envvar="HOTLEDGER_TOKEN", help="an operator's bearer token (default: a local dev token)")
@click.option("--stack", envvar="HOTLEDGER_STACK", help="a deployed stack: URL, API key and token from its outputs")
@click.option("--json", "as_json", is_flag=True, help="print the API's answers as JSON instead of tables")
@click.pass_context
def cli(ctx, api_url: str, token: str | None, stack: str | None, as_json: bool):
    ctx.ensure_object(dict)
    ctx.obj["json"] = as_json
    ctx.obj["stack"] = stack

    def target() -> Target:
        if stack:
            return stack_target(stack)
        if token:
            return Target(api_url, token)
        from infra import dev_issuer  # the local stack's issuer: only it trusts this token

        return Target(api_url, dev_issuer.token(scopes=("admin",)))

    ctx.obj["target"] = target


def _show(ctx, answer, render) -> None:
    if ctx.obj["json"]:
        click.echo(json.dumps(answer, indent=2))
    else:
        render(answer)


def _table(title: str, rows: list[dict], columns: list[str]) -> Table:
    table = Table(title=f"{title} ({len(rows)})", title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    return table


DEAD_LETTER_COLUMNS = {
    "writer": ["id", "topic", "partition", "offset", "key", "error", "replayed_at", "final"],
    "topic": ["id", "source_topic", "source_partition", "source_offset", "reason"],
    "stream": ["id", "stream_entry_id", "error"],
    "webhook": ["id", "event_id", "type", "user_id", "seq", "attempts", "last_status", "last_error"],
    "delay": ["queue", "dead"],
}


@cli.command("dead-letters")
@click.option("--source", type=click.Choice(list(DEAD_LETTER_COLUMNS)), help="one source only")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 500))
@click.pass_context
def dead_letters(ctx, source: str | None, limit: int):
    """What is stuck, by source."""
    query = urllib.parse.urlencode({k: v for k, v in (("source", source), ("limit", limit)) if v})
    answer = ctx.obj["target"]().ok("GET", f"/ops/dead-letters?{query}")
    _show(
        ctx,
        answer,
        lambda a: [console.print(_table(name, rows, DEAD_LETTER_COLUMNS[name])) for name, rows in a.items()],
    )


@cli.command()
@click.argument("source", type=click.Choice(["writer", "topic", "stream", "webhook"]))
@click.argument("ids", nargs=-1)
@click.pass_context
def replay(ctx, source: str, ids: tuple[str, ...]):
    """Replay SOURCE's dead letters: the IDS given (webhook: endpoint ids), or every one not replayed yet."""
    target, replayed, skipped = ctx.obj["target"](), [], {}
    chunks = [list(ids[i : i + REPLAY_CHUNK]) for i in range(0, len(ids), REPLAY_CHUNK)] or [None]
    with Progress(console=console, transient=True, disable=ctx.obj["json"]) as progress:
        task = progress.add_task(f"replaying {source}", total=len(chunks))
        for chunk in chunks:
            answer = target.ok(
                "POST", "/ops/dead-letters/replay", {"source": source, **({"ids": chunk} if chunk else {})}
            )
            replayed += answer["replayed"]
            skipped.update(answer["skipped"])
            progress.advance(task)
    outcome = {"replayed": replayed, "skipped": skipped}
    _show(
        ctx,
        outcome,
        lambda a: (
            console.print(f"replayed {len(a['replayed'])}: {', '.join(a['replayed']) or '-'}"),
            console.print(_table("skipped", [{"id": k, "why": v} for k, v in a["skipped"].items()], ["id", "why"])),
        ),
    )


@cli.command()
@click.argument("user_id", type=click.IntRange(1, 2**31 - 1))
@click.pass_context
def account(ctx, user_id: int):
    """One account as the DB and Redis hold it, its pending entries, whether they agree."""
    answer = ctx.obj["target"]().ok("GET", f"/ops/accounts/{user_id}")

    def render(a):
        both = Table(title=f"account {user_id}: {'agrees' if a['agrees'] else 'DOES NOT AGREE'}", title_justify="left")
        for column in ("", "db", "redis"):
            both.add_column(column)
        for name in ("balance", "version", "on_hold", "held", "open", "mode", "seq"):
            both.add_row(
                name, str(a["db"].get(name, "")), "not cached" if a["redis"] is None else str(a["redis"].get(name, ""))
            )
        both.add_row("expected (db + pending)", str(a["expected_balance"]), "")
        console.print(both)
        console.print(
            _table("pending entries", a["pending"], ["entry_id", "kind", "amount", "delta", "charged_at", "version"])
        )

    _show(ctx, answer, render)


@cli.command()
@click.pass_context
def reconciler(ctx):
    """Each reconciler part: its cursor and last run."""
    answer = ctx.obj["target"]().ok("GET", "/ops/reconciler")
    rows = [
        {
            "part": p["part"],
            "cursor": p["cursor"],
            "at_ms": (p["last_run"] or {}).get("at_ms"),
            "seconds": (p["last_run"] or {}).get("seconds"),
            "failed": (p["last_run"] or {}).get("failed"),
            "findings": json.dumps((p["last_run"] or {}).get("findings", {})),
        }
        for p in answer
    ]
    _show(ctx, answer, lambda _: console.print(_table("reconciler parts", rows, list(rows[0]) if rows else ["part"])))


@cli.command()
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 500))
@click.pass_context
def log(ctx, limit: int):
    """What operators did, newest first."""
    answer = ctx.obj["target"]().ok("GET", f"/ops/log?limit={limit}")
    rows = [{**line, "detail": json.dumps(line["detail"])} for line in answer]
    _show(
        ctx,
        answer,
        lambda _: console.print(_table("operators' log", rows, ["id", "created_at", "actor", "action", "detail"])),
    )


@cli.command("delay-queue")
@click.argument("queue")
@click.option("--replay", "elements", multiple=True, help="a dead element to offer again (repeatable)")
@click.pass_context
def delay_queue(ctx, queue: str, elements: tuple[str, ...]):
    """A delay queue's dead elements (oldest first); --replay E offers E again."""
    target, path = ctx.obj["target"](), f"/delay-queues/{urllib.parse.quote(queue, safe='')}/dead-letters"
    if elements:
        answer = target.ok("POST", f"{path}/replay", {"elements": list(elements)})
        _show(ctx, answer, lambda a: console.print(a))
        return
    answer = target.ok("GET", path)
    rows = answer if isinstance(answer, list) else answer.get("dead_letters", [])
    _show(
        ctx,
        answer,
        lambda _: console.print(_table(f"{queue}: dead elements", rows, list(rows[0]) if rows else ["element"])),
    )


@cli.command("rotate-webhook-secret")
@click.argument("endpoint_id")
@click.option(
    "--overlap-s",
    default=86_400,
    show_default=True,
    type=click.IntRange(0, 7 * 86_400),
    help="how long the old secret keeps signing next to the new one",
)
@click.pass_context
def rotate_webhook_secret(ctx, endpoint_id: str, overlap_s: int):
    """A new signing secret for a webhook endpoint (printed once: give it to the receiver)."""
    answer = ctx.obj["target"]().ok(
        "POST", f"/webhook-endpoints/{urllib.parse.quote(endpoint_id, safe='')}/rotate-secret", {"overlap_s": overlap_s}
    )
    _show(
        ctx,
        answer,
        lambda a: console.print(
            f"endpoint {a['endpoint_id']}: new secret {a['secret']} (the old one signs too for {overlap_s} s)"
        ),
    )


@cli.command("rotate-event-key")
@click.option(
    "--grace-s",
    default=86_400,
    show_default=True,
    type=click.IntRange(60, 30 * 86_400),
    help="how long the writer still accepts the previous key",
)
@click.pass_context
def rotate_event_key(ctx, grace_s: int):
    """A new event-signing key in the stack's Secrets Manager secret (needs --stack; local keys: restart `make up`)."""
    import boto3

    from infra.event_keys import rotate

    if not ctx.obj["stack"]:
        raise click.ClickException("--stack is needed: the local stack signs with .state/event-keys.json")
    outputs = {
        o["OutputKey"]: o["OutputValue"]
        for o in boto3.client("cloudformation")
        .describe_stacks(StackName=ctx.obj["stack"])["Stacks"][0]
        .get("Outputs", [])
    }
    console.print(f"new current key: {rotate(outputs['EventKeysSecretArn'], grace_s)}")


@cli.command("seal-webhook-secrets")
@click.pass_context
def seal_webhook_secrets(ctx):
    """Seals every webhook signing secret kept in clear from before the sealing (once; running it again seals none)."""
    answer = ctx.obj["target"]().ok("POST", "/ops/webhook-secrets/seal")
    _show(
        ctx,
        answer,
        lambda a: console.print(f"sealed {a['sealed']} secrets of endpoints {', '.join(a['endpoints']) or '-'}"),
    )


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="hotledger ops", standalone_mode=False)
    except click.ClickException as exc:  # a usage error: 2 (nothing was called); an answer refused: 1
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
