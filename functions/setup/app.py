"""The stack's setup, a CloudFormation custom resource run on every deploy (and by hand with `sam remote invoke`):
discovers the MSK brokers (returned as BootstrapBrokers for the other functions), creates the ledger topic and its
dead-letter topic when missing, and applies the schema migrations. Every step is idempotent; Delete does nothing
(the data outlives the stack: the DB and Redis are snapshotted, the secrets retained)."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hotledger import observability
from hotledger.config import settings, with_values
from hotledger.dal import db, schema, topics

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = observability.logger()
tracer = observability.tracer()


def run(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    cfg = settings()
    out = {"BootstrapBrokers": cfg.kafka_bootstrap, "TopicsCreated": "", "MigrationsApplied": ""}
    if cfg.event_transport == "kafka":
        if env.get("MSK_CLUSTER_ARN"):
            out["BootstrapBrokers"] = topics.bootstrap_brokers(env["MSK_CLUSTER_ARN"])
        created = topics.ensure_topics(
            with_values(cfg, kafka_bootstrap=out["BootstrapBrokers"]),
            [cfg.kafka_topic, topics.dead_letter_topic(cfg.kafka_topic)],
            int(env.get("KAFKA_PARTITIONS", "6")),
        )
        out["TopicsCreated"] = ",".join(created)
    conn = db.connect(with_values(cfg, db_name=""))  # the database itself may not exist yet
    try:
        out["MigrationsApplied"] = ",".join(schema.migrate(conn, cfg.db_name, Path(env.get("MIGRATIONS_DIR", "/opt"))))
    finally:
        conn.close()
    logger.info("setup done", extra=out)
    return out


def _answer(event: dict[str, Any], context: LambdaContext, status: str, data: dict[str, str], reason: str = "") -> None:
    """The custom resource's answer: a PUT of the result to CloudFormation's pre-signed S3 URL."""
    body = json.dumps(
        {
            "Status": status,
            "Reason": reason or f"see log stream {context.log_stream_name}",
            "PhysicalResourceId": event.get("PhysicalResourceId") or f"{event['StackId']}-setup",
            "StackId": event["StackId"],
            "RequestId": event["RequestId"],
            "LogicalResourceId": event["LogicalResourceId"],
            "Data": data,
        }
    ).encode()
    request = urllib.request.Request(
        event["ResponseURL"], data=body, method="PUT", headers={"Content-Type": "", "Content-Length": str(len(body))}
    )
    with urllib.request.urlopen(request, timeout=30):
        pass


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, str]:
    if "RequestType" not in event:  # invoked directly
        return run()
    status, reason = "SUCCESS", ""
    data: dict[str, str] = {}
    try:
        if event["RequestType"] != "Delete":
            data = run()
    except Exception as exc:  # CloudFormation must hear of a failure, or the deploy hangs for an hour
        logger.exception("setup failed")
        status, reason = "FAILED", f"{type(exc).__name__}: {exc}"[:1000]
    _answer(event, context, status, data, reason)
    return {"Status": status, **data}
