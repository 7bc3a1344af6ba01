"""Server ports (the tests' and the benchmarks') are drawn below the kernel's ephemeral
range, so an outgoing connection cannot take one between the draw and the server's bind."""

from __future__ import annotations

import socket

from bench.common.processes import EPHEMERAL_RANGE, LOWEST_PORT, free_ports


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    lowest_ephemeral = int(EPHEMERAL_RANGE.read_text().split()[0])
    with socket.socket() as taken:  # an outgoing-style port: the draw never lands on it
        taken.bind(("127.0.0.1", 0))
        ports = free_ports(50)
        assert taken.getsockname()[1] not in ports

    assert len(set(ports)) == 50
    assert all(LOWEST_PORT <= port < lowest_ephemeral for port in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free again once drawn
