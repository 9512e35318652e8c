"""Small administrative calls: is the broker up, create and delete topics, count partitions.

Used by ``kbatch broker``, ``kbatch topics`` and the test fixtures. Every call opens its own
short-lived client; none is on the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiokafka import AIOKafkaClient
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, TopicAuthorizationFailedError
from aiokafka.protocol.metadata import MetadataRequest

from consumer.kafka.client_config import (
    FIRST_ANSWER_TIMEOUT_S,
    client_kwargs,
    security_kwargs,
    start_client,
)
from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.durability import (
    choose_replication,
    cluster_min_insync,
    cluster_replication,
    fragile_topics_message,
    replication_warning,
)
from consumer.kafka.errors import TopicCreationError

log = logging.getLogger(__name__)


async def _broker_answers(
    bootstrap: str, timeout_s: float, settings: KafkaClientSettings | None
) -> bool:
    security = security_kwargs(settings) if settings is not None else {}
    client = AIOKafkaClient(
        bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000), **security
    )
    try:
        # bootstrap() sends a MetadataRequest and raises unless a broker answers it.
        await asyncio.wait_for(client.bootstrap(), timeout_s)
        return True
    except (KafkaError, OSError, TimeoutError):
        return False
    finally:
        await client.close()


def broker_answers(
    bootstrap: str, timeout_s: float = 5.0, client: KafkaClientSettings | None = None
) -> bool:
    """True when a broker at ``bootstrap`` answers a metadata request within ``timeout_s``
    (``client``: its security settings; default plaintext).

    Synchronous: runs its own event loop, in a helper thread when the caller's thread already
    runs one.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_broker_answers(bootstrap, timeout_s, client))
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _broker_answers(bootstrap, timeout_s, client)).result()


TOPIC_VISIBLE_TIMEOUT_S = 10.0
"""How long a topic creation waits for the broker's metadata to list the new topics, each
partition with a leader. CreateTopics answers once the controller has the topics; a broker
serves them in its metadata a moment later: a Metadata request sent right after the answer may
say ``UNKNOWN_TOPIC_OR_PARTITION``, and a client that asks then (a backfill listing the
topic's partitions, a script's producer) is told the topic does not exist."""

TOPIC_VISIBLE_RETRY_S = 0.05

_NOT_YET = frozenset({3, 5})
"""``UNKNOWN_TOPIC_OR_PARTITION``, ``LEADER_NOT_AVAILABLE``: a new topic the broker does not
serve yet. Any other error (an ACL denying Describe) ends the wait for that topic."""


async def _await_visible(
    admin: AIOKafkaAdminClient,
    partitions_by_topic: dict[str, int],
    timeout_s: float = TOPIC_VISIBLE_TIMEOUT_S,
) -> list[str]:
    """Wait until the metadata lists each topic of ``partitions_by_topic`` with at least that
    many partitions, each with a leader; returns the topics still not listed so after
    ``timeout_s`` seconds (a WARNING names them)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pending = dict(partitions_by_topic)
    while pending:
        with contextlib.suppress(KafkaError):
            for topic in await admin.describe_topics(list(pending)):
                name = topic.get("topic")
                code = topic.get("error_code", 0)
                partitions = topic.get("partitions") or []
                if code not in _NOT_YET and code != 0:
                    pending.pop(name, None)  # not ours to see (an ACL): nothing to wait for
                elif (
                    code == 0
                    and len(partitions) >= pending.get(name, 1)
                    and all(p.get("leader", -1) >= 0 for p in partitions)
                ):
                    pending.pop(name, None)
        if not pending or loop.time() >= deadline:
            break
        await asyncio.sleep(TOPIC_VISIBLE_RETRY_S)
    if pending:
        log.warning(
            "topics %s were created but the broker's metadata does not list them with a "
            "leader for every partition after %g s",
            sorted(pending),
            timeout_s,
        )
    return sorted(pending)


async def create_topics(
    bootstrap: str,
    names: Iterable[str],
    partitions: int = 1,
    config: dict[str, str] | None = None,
    replication_factor: int = 1,
) -> None:
    """Create topics (``replication_factor`` replicas each) and wait until the metadata lists
    them (:data:`TOPIC_VISIBLE_TIMEOUT_S`); existing ones are left as they are."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = list(names)
        topics = [
            NewTopic(
                name,
                num_partitions=partitions,
                replication_factor=replication_factor,
                topic_configs=config or {},
            )
            for name in names
        ]
        with contextlib.suppress(TopicAlreadyExistsError):
            await admin.create_topics(topics)
        await _await_visible(admin, dict.fromkeys(names, partitions))
    finally:
        await admin.close()


async def ensure_topics(
    bootstrap: str,
    partitions_by_topic: dict[str, int],
    replication_factor: int | None = None,
    security: dict[str, Any] | None = None,
) -> list[str]:
    """Create the topics that do not exist yet; returns the names created, once the metadata
    lists them (:data:`TOPIC_VISIBLE_TIMEOUT_S`: a client that asks next finds them). Existing
    topics are left as they are (their partition count is never
    changed).

    Replicas: ``replication_factor``, else the cluster's ``default.replication.factor``, else
    ``min(3, brokers)`` (:func:`consumer.kafka.durability.choose_replication`, as the jobs
    topic's). Logs the creation (INFO, with the replicas and why) and a WARNING when they are
    fragile (:func:`consumer.kafka.durability.replication_warning`: fewer than 3, or not more
    than the broker's ``min.insync.replicas``).

    Raises:
        KafkaUnavailableError: no broker answered.
        TopicCreationError: the broker refused to create a missing topic, or the replicas
            could not be chosen (no broker in the metadata).
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(security or {}))
    await start_client(
        admin.start, admin.close, f"no Kafka broker answered at {bootstrap}", FIRST_ANSWER_TIMEOUT_S
    )
    try:
        existing = set(await admin.list_topics())
        missing = [name for name in partitions_by_topic if name not in existing]
        if not missing:
            return missing
        try:
            default, brokers = await cluster_replication(admin)
            replicas, why = choose_replication(replication_factor, default, brokers)
            min_insync = await cluster_min_insync(admin)
        except (KafkaError, ValueError) as err:
            raise _creation_error(missing, bootstrap, repr(err)) from err
        new = [
            NewTopic(n, num_partitions=partitions_by_topic[n], replication_factor=replicas)
            for n in missing
        ]
        try:
            response = await admin.create_topics(new)
        except TopicAlreadyExistsError:
            return missing
        except KafkaError as err:
            raise _creation_error(missing, bootstrap, repr(err)) from err
        refused = _refused(response)
        if refused:
            raise _creation_error(missing, bootstrap, "; ".join(refused))
        await _await_visible(admin, {n: partitions_by_topic[n] for n in missing})
    finally:
        await admin.close()
    log.info("created topics %s (%d replica(s): %s)", missing, replicas, why)
    warning = replication_warning(replicas, min_insync)
    if warning is not None:
        log.warning("%s", fragile_topics_message(missing, replicas, why, warning, brokers))
    return missing


def _refused(response: Any) -> list[str]:
    """``"topic: error"`` for each topic a CreateTopics response did not create (an existing
    topic, created by a concurrent caller, counts as created)."""
    refused = []
    for topic_error in getattr(response, "topic_errors", ()):
        name, code, *rest = topic_error
        if code not in (0, TopicAlreadyExistsError.errno):
            message = rest[0] if rest and rest[0] else f"error code {code}"
            refused.append(f"{name}: {message}")
    return refused


def _creation_error(missing: list[str], bootstrap: str, reason: str) -> TopicCreationError:
    return TopicCreationError(
        f"topics {missing} do not exist on {bootstrap} and could not be created ({reason}): "
        "create them with your Kafka tooling (or grant CREATE on them), then start again"
    )


async def delete_topics(bootstrap: str, names: Iterable[str]) -> None:
    """Delete topics; missing ones are ignored."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        with contextlib.suppress(KafkaError):
            await admin.delete_topics(list(names))
    finally:
        await admin.close()


async def partition_count(
    bootstrap: str, topic: str, security: dict[str, Any] | None = None
) -> int | None:
    """Partitions of ``topic`` (the most members of one group that get work); None when the
    topic does not exist.

    Raises:
        KafkaUnavailableError: no broker answered.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(security or {}))
    await start_client(
        admin.start, admin.close, f"no Kafka broker answered at {bootstrap}", FIRST_ANSWER_TIMEOUT_S
    )
    try:
        if topic not in await admin.list_topics():
            return None  # describing it could create it (auto.create.topics.enable)
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    if described.get("error_code", 0) != 0:
        return None
    return len(described.get("partitions") or []) or None


GROUP_DESCRIBE_ATTEMPTS = 40
GROUP_DESCRIBE_RETRY_S = 0.5
"""A group is described again after a retriable error (``COORDINATOR_NOT_AVAILABLE`` while a
new cluster creates ``__consumer_offsets``) for up to 20 s, as a consumer waits for its
coordinator."""


async def live_group_members(client: KafkaClientSettings, group_id: str) -> int:
    """Members the consumer group ``group_id`` has now (0: empty, dead or unknown), as its
    coordinator describes it (DescribeGroups). A client outside the group cannot commit
    offsets under a group with members: the broker answers ``UNKNOWN_MEMBER_ID``.

    Raises:
        KafkaUnavailableError: no broker answered (KafkaSecurityError: refused).
        KafkaError: the group could not be described (an ACL denial, say; a retriable error
            for :data:`GROUP_DESCRIBE_ATTEMPTS` tries).
    """
    admin = AIOKafkaAdminClient(**client_kwargs(client))
    await start_client(
        admin.start,
        admin.close,
        f"no Kafka broker answered at {client.bootstrap}",
        FIRST_ANSWER_TIMEOUT_S,
    )
    try:
        for attempt in range(GROUP_DESCRIBE_ATTEMPTS):
            try:
                responses = await admin.describe_consumer_groups([group_id])
                break
            except KafkaError as err:  # no coordinator yet: a fresh cluster's offsets topic
                if not err.retriable or attempt == GROUP_DESCRIBE_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(GROUP_DESCRIBE_RETRY_S)
    finally:
        await admin.close()
    members = 0
    for response in responses:
        for (
            error_code,
            name,
            _state,
            _protocol_type,
            _protocol,
            group_members,
            *_,
        ) in response.groups:
            if error_code == 0 and name == group_id:
                members += len(group_members)
    return members


async def missing_topics(
    bootstrap: str, topics: Iterable[str], security: dict[str, Any] | None = None
) -> list[str]:
    """Those of ``topics`` that do not exist, in order. A topic this principal may not describe
    is not counted (:func:`denied_topics` tells it from a missing one); nothing is created
    (the metadata request by name does not allow auto-creation).

    Raises:
        KafkaUnavailableError: no broker answered (KafkaSecurityError: refused).
    """
    wanted = list(topics)
    client = AIOKafkaClient(bootstrap_servers=bootstrap, **(security or {}))
    await start_client(
        client.bootstrap,
        client.close,
        f"no Kafka broker answered at {bootstrap}",
        FIRST_ANSWER_TIMEOUT_S,
    )
    try:
        existing = (await client.fetch_all_metadata()).topics()
        absent = [t for t in wanted if t not in existing]
        denied = set(await denied_topics(client, absent)) if absent else set()
    finally:
        await client.close()
    return [t for t in absent if t not in denied]


async def denied_topics(client: AIOKafkaClient, topics: Iterable[str]) -> list[str]:
    """Those of ``topics`` the broker answers ``TOPIC_AUTHORIZATION_FAILED`` for, asked by
    name through ``client`` (a started aiokafka client). A listing of all topics leaves out
    the ones this principal may not describe, so a missing topic and a denied one look the
    same there. ``[]`` when the broker does not answer."""
    wanted = list(topics)
    node_id = client.get_random_node()
    if node_id is None or not wanted:
        return []
    try:
        response = await client.send(node_id, MetadataRequest(wanted, False))
    except KafkaError:
        return []
    return [
        name
        for code, name, *_ in response.topics
        if code == TopicAuthorizationFailedError.errno and name in wanted
    ]
