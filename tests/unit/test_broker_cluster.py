"""The local cluster's layout: ports, listeners, voters and replication of each node (no JVM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumer.broker.cluster import LocalCluster, status_at
from consumer.broker.local import BrokerError


def props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_three_nodes_on_consecutive_client_ports_with_their_own_controller_and_internal_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KBATCH_CACHE_DIR", str(tmp_path))
    cluster = LocalCluster(port=30000, nodes=3, advertised_ports=(40000, 40001, 40002))
    assert cluster.bootstrap == "127.0.0.1:40000,127.0.0.1:40001,127.0.0.1:40002"
    assert cluster.ports == list(range(30000, 30009))
    node = props(cluster.node(2)._properties())
    assert node["node.id"] == "2"
    assert node["controller.quorum.voters"] == (
        "1@127.0.0.1:30003,2@127.0.0.1:30004,3@127.0.0.1:30005"
    )
    assert node["listeners"] == (
        "PLAINTEXT://127.0.0.1:30001,INTERNAL://127.0.0.1:30007,CONTROLLER://127.0.0.1:30004"
    )
    # Clients meet the proxy; replication stays on the internal listener.
    assert node["advertised.listeners"] == (
        "PLAINTEXT://127.0.0.1:40001,INTERNAL://127.0.0.1:30007"
    )
    assert node["inter.broker.listener.name"] == "INTERNAL"
    for key, value in [
        ("default.replication.factor", "3"),
        ("min.insync.replicas", "2"),
        ("offsets.topic.replication.factor", "3"),
        ("transaction.state.log.replication.factor", "3"),
        ("transaction.state.log.min.isr", "2"),
    ]:
        assert node[key] == value, key
    assert node["log.dirs"] == str(tmp_path / "cluster-30000" / "node-2" / "data")


def test_two_nodes_keep_one_in_sync_replica_to_spare() -> None:
    node = props(LocalCluster(port=30000, nodes=2).node(1)._properties())
    assert (node["default.replication.factor"], node["min.insync.replicas"]) == ("2", "1")


@pytest.mark.parametrize("nodes", [1, 6])
def test_a_cluster_has_two_to_five_nodes(nodes: int) -> None:
    with pytest.raises(BrokerError, match="2 to 5 nodes"):
        LocalCluster(port=30000, nodes=nodes)


def test_status_of_nothing_started_is_one_line_and_false(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KBATCH_CACHE_DIR", str(tmp_path))
    from tests.integration.harness import free_port

    port = free_port()
    assert status_at(port) == (False, f"not answering at 127.0.0.1:{port}")
