"""Grant ACLs (Kafka's CreateAcls API) as a super user: the secured local broker's
``kbatch broker acl`` and the tests. Not on any request path.

aiokafka's admin client has no ACL call; its protocol module has the request, sent here as the
admin client sends its own (one request per binding). Codes from Kafka's
``org.apache.kafka.common.acl`` / ``resource`` enums.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import CreateAclsRequest

from consumer.kafka.client_config import client_kwargs, start_client
from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.errors import KafkaSecurityError

__all__ = ["Acl", "create_acls"]

Operation = Literal[
    "ALL", "READ", "WRITE", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "IDEMPOTENT_WRITE"
]
_OPERATIONS = {
    "ALL": 2,
    "READ": 3,
    "WRITE": 4,
    "CREATE": 5,
    "DESCRIBE": 8,
    "DESCRIBE_CONFIGS": 10,
    "IDEMPOTENT_WRITE": 12,
}
_RESOURCES = {"topic": 2, "group": 3, "cluster": 4, "transactional_id": 5}
_PATTERNS = {"literal": 3, "prefixed": 4}
_ALLOW = 3


@dataclass(frozen=True, slots=True)
class Acl:
    """One allow binding: ``principal`` (``User:kbatch``) may ``operation`` on the resource
    ``name`` (a literal name or, with ``pattern="prefixed"``, every name starting with it;
    the cluster resource is named ``kafka-cluster``), from any host."""

    principal: str
    operation: Operation
    resource: Literal["topic", "group", "cluster", "transactional_id"]
    name: str
    pattern: Literal["literal", "prefixed"] = "literal"


async def create_acls(client: KafkaClientSettings, acls: Iterable[Acl]) -> None:
    """Create every binding of ``acls`` (an existing one is left as it is).

    Raises:
        KafkaUnavailableError: no broker answered.
        KafkaSecurityError: the broker refused a binding (``client`` is not a super user, or
            the broker has no authorizer); the message names the binding.
    """
    admin = AIOKafkaAdminClient(**client_kwargs(client))
    await start_client(admin.start, admin.close, f"cannot grant ACLs on {client.bootstrap}")
    try:
        for acl in acls:
            request = CreateAclsRequest(
                _RESOURCES[acl.resource],
                acl.name,
                _PATTERNS[acl.pattern],
                acl.principal,
                "*",
                _OPERATIONS[acl.operation],
                _ALLOW,
            )
            response = await admin._send_to_controller(request)  # see docstring
            for code, message in response.creation_responses:
                if code != 0:
                    raise KafkaSecurityError(f"the broker refused the ACL {acl}: {message}")
    finally:
        await admin.close()
