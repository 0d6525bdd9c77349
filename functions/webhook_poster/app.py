"""The webhook poster (issue 32 item 14): the HTTP POST of one webhook attempt, outside the VPC. The sender runs in the
VPC (it reads the DB), and the VPC the stack creates has no NAT; a function outside any VPC reaches the internet
through Lambda's own. The sender signs each attempt and invokes this function with it (the URL, the signed headers,
the body and the time left: never a secret) and records what it answers. Here the URL is checked (https, a public
address: resolved where the connection is made, and the connection pinned to the checked addresses) and posted within
one deadline; any error is the attempt's failure, answered, never raised. This function reads no setting but
WEBHOOK_ALLOW_LOCAL (local receivers, never in AWS), holds no secret and reaches nothing of the stack."""

from __future__ import annotations

import os
from typing import Any

from hotledger.webhooks.service import Attempt, Request, attempt


def handler(event: dict[str, Any], context: Any) -> Attempt:
    request: Request = {
        "url": str(event["url"]),
        "headers": {str(k): str(v) for k, v in dict(event["headers"]).items()},
        "body": str(event["body"]),
        "timeout_s": float(event["timeout_s"]),
    }
    return attempt(request, os.environ.get("WEBHOOK_ALLOW_LOCAL") == "1")
