"""Event shapes Lambda receives, built the way API Gateway, MSK and EventBridge build them."""

from __future__ import annotations

import base64
import json
import time
import uuid
from datetime import UTC, datetime
from urllib.parse import parse_qs


def api_gateway_proxy(
    method: str,
    path: str,
    body: str | bytes | None = None,
    headers: dict | None = None,
    query: str = "",
    stage: str = "v1",
    source_ip: str = "127.0.0.1",
    authorizer: dict | None = None,
) -> dict:
    """A REST API (v1 payload) proxy event for the `/{proxy+}` resource; `authorizer` is what the API's Lambda
    authorizer returned (principalId and its context), absent when no authorizer ran."""
    headers = dict(headers or {})
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    multi_query = parse_qs(query, keep_blank_values=True) if query else None
    request_id = str(uuid.uuid4())
    now = datetime.now(UTC)
    return {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": headers or None,
        "multiValueHeaders": {k: [v] for k, v in headers.items()} or None,
        "queryStringParameters": {k: v[-1] for k, v in multi_query.items()} if multi_query else None,
        "multiValueQueryStringParameters": multi_query,
        "pathParameters": {"proxy": path.lstrip("/")} if path != "/" else None,
        "stageVariables": None,
        "requestContext": {
            "resourceId": "proxy",
            "resourcePath": "/{proxy+}",
            "httpMethod": method,
            "extendedRequestId": request_id,
            "requestTime": now.strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "path": f"/{stage}{path}",
            "accountId": "000000000000",
            "protocol": "HTTP/1.1",
            "stage": stage,
            "domainPrefix": "localhost",
            "requestTimeEpoch": int(now.timestamp() * 1000),
            "requestId": request_id,
            "identity": {"sourceIp": source_ip, "userAgent": headers.get("User-Agent", "")},
            "domainName": "localhost",
            "apiId": "local",
            **({"authorizer": authorizer} if authorizer is not None else {}),
        },
        "body": body,
        "isBase64Encoded": False,
    }


def api_gateway_http(
    method: str,
    path: str,
    body: str | bytes | None = None,
    headers: dict | None = None,
    query: str = "",
    source_ip: str = "127.0.0.1",
    jwt: dict | None = None,
) -> dict:
    """An HTTP API (payload format 2.0) event of the `$default` stage; `jwt` is what its JWT authorizer passes
    ({"claims": {name: text}, "scopes": [...] or None}), absent when no authorizer ran. Header names arrive lower-cased,
    a repeated header's values joined by commas."""
    joined: dict[str, str] = {}
    for name, value in (headers or {}).items():
        joined[name.lower()] = f"{joined[name.lower()]},{value}" if name.lower() in joined else value
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    request_id = str(uuid.uuid4())
    now = datetime.now(UTC)
    multi_query = parse_qs(query, keep_blank_values=True) if query else None
    event = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": query,
        "headers": joined,
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "local",
            "domainName": "localhost",
            "domainPrefix": "localhost",
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": joined.get("user-agent", ""),
            },
            "requestId": request_id,
            "routeKey": "$default",
            "stage": "$default",
            "time": now.strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "timeEpoch": int(now.timestamp() * 1000),
            **({"authorizer": {"jwt": jwt}} if jwt is not None else {}),
        },
        "isBase64Encoded": False,
    }
    if multi_query:
        event["queryStringParameters"] = {k: ",".join(v) for k, v in multi_query.items()}
    if body is not None:
        event["body"] = body
    return event


def msk(
    topic: str,
    records: list[tuple[int, int, bytes | None, bytes | None, int]],
    cluster_arn: str = "arn:aws:kafka:us-east-1:000000000000:cluster/local/00000000-0000-0000-0000-000000000000-1",
    bootstrap: str = "127.0.0.1:9092",
) -> dict:
    """An MSK event: records given as (partition, offset, key, value, timestamp_ms), grouped per partition."""
    grouped: dict[str, list] = {}
    for partition, offset, key, value, ts in records:
        grouped.setdefault(f"{topic}-{partition}", []).append(
            {
                "topic": topic,
                "partition": partition,
                "offset": offset,
                "timestamp": ts,
                "timestampType": "CREATE_TIME",
                "key": base64.b64encode(key).decode() if key is not None else None,
                "value": base64.b64encode(value).decode() if value is not None else None,
                "headers": [],
            }
        )
    return {
        "eventSource": "aws:kafka",
        "eventSourceArn": cluster_arn,
        "bootstrapServers": bootstrap,
        "records": grouped,
    }


def scheduled(rule_arn: str = "arn:aws:events:us-east-1:000000000000:rule/hotledger-reconcile") -> dict:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "000000000000",
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": "us-east-1",
        "resources": [rule_arn],
        "detail": {},
    }


class LambdaContext:
    """What handlers may read from the Lambda context object."""

    def __init__(self, function_name: str, timeout_s: int = 30, memory_mb: int = 512):
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = memory_mb
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:000000000000:function:{function_name}"
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def json_body(response: dict):
    return json.loads(response["body"]) if response.get("body") else None
