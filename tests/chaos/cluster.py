"""The chaos cluster: three nodes of a :class:`LocalCluster`, each behind a proxy
(:class:`~tests.chaos.proxy.ProxySet`); the session fixture is in ``conftest.py``."""

from __future__ import annotations

import contextlib
import random
import socket
from dataclasses import dataclass

from consumer.broker.cluster import LocalCluster
from tests.chaos.proxy import ProxySet

NODES = 3


def free_port_run(n: int, attempts: int = 200) -> int:
    """A port ``p`` with ``p .. p + n - 1`` all free on 127.0.0.1 right now, below Linux's
    ephemeral range (32768-60999): a client's outgoing socket never takes a port a killed
    node needs again for its restart."""
    for _ in range(attempts):
        base = random.randrange(20_000, 32_768 - n)
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + n):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise AssertionError(f"no {n} consecutive free ports on 127.0.0.1")


@dataclass(frozen=True)
class ChaosCluster:
    """The cluster, its proxies, and the bootstrap that goes through them."""

    cluster: LocalCluster
    proxies: ProxySet

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def heal_all(self) -> None:
        """Clear every network fault and start every node that is down."""
        self.proxies.heal()
        self.proxies.set_delay(0.0)
        self.proxies.set_bandwidth(None)
        for node in self.cluster.members:
            if node.pid() is None:
                node.start()
