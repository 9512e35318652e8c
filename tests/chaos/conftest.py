"""The chaos fixture: a three-node cluster of the tests' own, each node behind a proxy.

One cluster per test module (starting three JVMs takes ~30 s on two cores; three idle JVMs
left running for the rest of ``make test`` would take CPU from every later test); every
scenario leaves it whole again (all nodes up, faults cleared) before the next one starts.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from consumer.broker.cluster import LocalCluster
from tests.chaos.cluster import NODES, ChaosCluster, free_port_run
from tests.chaos.proxy import ProxySet


@pytest.fixture(scope="module")
def chaos_cluster() -> Iterator[ChaosCluster]:
    base = free_port_run(3 * NODES + NODES)  # client, controller, internal; then the proxies
    proxy_ports = [base + 3 * NODES + i for i in range(NODES)]
    cluster = LocalCluster(port=base, nodes=NODES, advertised_ports=tuple(proxy_ports))
    proxies = ProxySet([base + i for i in range(NODES)], proxy_ports).start()
    try:
        cluster.start(fresh=True)
        yield ChaosCluster(cluster, proxies)
    finally:
        cluster.kill()
        proxies.stop()
        shutil.rmtree(cluster.home, ignore_errors=True)
