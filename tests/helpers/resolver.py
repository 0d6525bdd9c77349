"""A local DNS resolver for the local runtime's child processes: RebindingResolver answers queries for one host name
over UDP (DNS wire format), a public address and a private one in turn, as a rebinding attacker's name server does
with a TTL of 0. A child started with resolver_env(...) resolves names under its zone through it (local_resolver/
sitecustomize.py wraps socket.getaddrinfo for that zone only); every other name resolves as usual."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import threading
from pathlib import Path

ZONE = ".hotledger.test"
_SITE = Path(__file__).resolve().parent / "local_resolver"


class RebindingResolver:
    """Answers `name`'s queries with `answers` in turn, round and round; `asked` is every address it answered."""

    def __init__(self, name: str, answers: tuple[str, ...]):
        assert name.endswith(ZONE)
        self.name, self.answers, self.asked = name, answers, []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                query, client = self.sock.recvfrom(512)
            except OSError:
                return  # closed
            self.sock.sendto(self._answer(query), client)

    def _answer(self, query: bytes) -> bytes:
        (query_id,) = struct.unpack("!H", query[:2])
        question = query[12:]
        labels, at = [], 0
        while question[at]:
            labels.append(question[at + 1 : at + 1 + question[at]].decode())
            at += 1 + question[at]
        question = question[: at + 5]  # the name, its 0, QTYPE and QCLASS
        if ".".join(labels) != self.name.lstrip("."):
            return struct.pack("!HHHHHH", query_id, 0x8183, 1, 0, 0, 0) + question  # NXDOMAIN
        address = self.answers[len(self.asked) % len(self.answers)]
        self.asked.append(address)
        packed = ipaddress.ip_address(address).packed
        record = struct.pack("!HHHIH", 0xC00C, 1 if len(packed) == 4 else 28, 1, 0, len(packed)) + packed  # TTL 0
        return struct.pack("!HHHHHH", query_id, 0x8180, 1, 1, 0, 0) + question + record

    def close(self) -> None:
        self.sock.close()


def resolver_env(resolver: RebindingResolver) -> dict[str, str]:
    """The environment a child process needs to resolve ZONE's names through `resolver`."""
    return {
        "PYTHONPATH": os.pathsep.join(p for p in (str(_SITE), os.environ.get("PYTHONPATH", "")) if p),
        "HOTLEDGER_TEST_RESOLVER": resolver.address,
        "HOTLEDGER_TEST_RESOLVER_ZONE": ZONE,
    }
