"""Imported at the start of a child process given helpers.resolver.resolver_env: names under
HOTLEDGER_TEST_RESOLVER_ZONE are resolved by the DNS server at HOTLEDGER_TEST_RESOLVER (one query, asking for any
record; its A or AAAA answers), every other name by the system's resolver. Stdlib only: nothing else is imported yet."""

import ipaddress
import os
import random
import socket
import struct

_SERVER, _ZONE = os.environ.get("HOTLEDGER_TEST_RESOLVER"), os.environ.get("HOTLEDGER_TEST_RESOLVER_ZONE")


def _query(host: str) -> list[str]:
    query_id = random.randrange(1 << 16)
    name = b"".join(bytes([len(label)]) + label.encode() for label in host.split(".")) + b"\0"
    packet = struct.pack("!HHHHHH", query_id, 0x0100, 1, 0, 0, 0) + name + struct.pack("!HH", 255, 1)  # ANY, IN
    server_host, server_port = _SERVER.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(5)
        sock.sendto(packet, (server_host, int(server_port)))
        reply = sock.recv(512)
    _, flags, _, answers, _, _ = struct.unpack("!HHHHHH", reply[:12])
    if flags & 0xF:
        raise socket.gaierror(socket.EAI_NONAME, f"{host}: no such name")
    at, found = 12 + len(name) + 4, []
    for _ in range(answers):
        _, kind, _, _, length = struct.unpack("!HHHIH", reply[at : at + 12])
        found.append(str(ipaddress.ip_address(reply[at + 12 : at + 12 + length])))
        at += 12 + length
    return found


if _SERVER and _ZONE:
    _system = socket.getaddrinfo

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        if not (isinstance(host, str) and host.endswith(_ZONE)):
            return _system(host, port, family, type, proto, flags)
        return [
            (
                socket.AF_INET6 if ":" in address else socket.AF_INET,
                socket.SOCK_STREAM,
                socket.IPPROTO_TCP,
                "",
                (address, int(port), 0, 0) if ":" in address else (address, int(port)),
            )
            for address in _query(host)
        ]

    socket.getaddrinfo = getaddrinfo
