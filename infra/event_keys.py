"""The keyring that signs Kafka events (functions/hotledger/dal/event_keys.py): make one, rotate one.

infra/event_keys.py local                       path of the local dev keyring (.state/event-keys.json, made once)
infra/event_keys.py rotate --secret-id ARN      new current key in Secrets Manager; the old one stays accepted
                     [--grace-s 86400]          for --grace-s seconds (longer than the writer's worst lag and
                                                than the functions' cache, EVENT_KEYS_MAX_AGE_S)
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from pathlib import Path

STATE = Path(os.environ.get("HOTLEDGER_STATE_DIR", Path(__file__).resolve().parents[1] / ".state"))
LOCAL_KEYRING = STATE / "event-keys.json"


def new_kid() -> str:
    return f"k{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(2)}"


def new_keyring() -> dict:
    return {"kid": new_kid(), "key": secrets.token_urlsafe(48)}


def rotated(keyring: dict, grace_s: int, now_s: float) -> dict:
    """A new current key; the current one becomes the previous, accepted for grace_s more seconds."""
    return {
        **new_keyring(),
        "previous_kid": keyring["kid"],
        "previous_key": keyring["key"],
        "previous_until": int(now_s + grace_s),
    }


def rotate(secret_id: str, grace_s: int, client=None) -> str:
    """Put the rotated keyring as the secret's new AWSCURRENT version; returns the new key id."""
    import boto3

    client = client or boto3.client("secretsmanager")
    keyring = rotated(json.loads(client.get_secret_value(SecretId=secret_id)["SecretString"]), grace_s, time.time())
    client.put_secret_value(SecretId=secret_id, SecretString=json.dumps(keyring))
    return keyring["kid"]


def local_keyring() -> str:
    """The local dev keyring's JSON, made on first use (0600: it is a secret like any other)."""
    if not LOCAL_KEYRING.exists():
        LOCAL_KEYRING.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(LOCAL_KEYRING, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(new_keyring(), out)
    return LOCAL_KEYRING.read_text()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("local")
    rotate_cmd = sub.add_parser("rotate")
    rotate_cmd.add_argument("--secret-id", required=True)
    rotate_cmd.add_argument("--grace-s", type=int, default=86400)
    args = parser.parse_args(argv)
    if args.command == "local":
        local_keyring()
        print(LOCAL_KEYRING)
    else:
        print(rotate(args.secret_id, args.grace_s))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
