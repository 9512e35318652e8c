"""Fixtures shared by every test: the real local broker and unique topics.

The broker fixture reuses a broker that already answers (``make test`` starts one) or starts
one through the same code as ``kbatch broker start``. ``KBATCH_TEST_BOOTSTRAP`` points the
suite at another broker.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from consumer.broker.local import LocalBroker
from consumer.kafka.admin import create_topics, delete_topics

TopicFactory = Callable[..., Awaitable[str]]


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """The bootstrap address of a running broker (started here when none answers)."""
    bootstrap = os.environ.get("KBATCH_TEST_BOOTSTRAP")
    if bootstrap:
        return bootstrap
    return LocalBroker(port=int(os.environ.get("KBATCH_TEST_BROKER_PORT", "9092"))).start()


@pytest.fixture
async def new_topic(kafka_bootstrap: str) -> AsyncIterator[TopicFactory]:
    """Create topics with unique names for one test; all are deleted afterwards."""
    created: list[str] = []

    async def make(prefix: str = "t", partitions: int = 1) -> str:
        name = f"test.{prefix}.{uuid.uuid4().hex[:10]}"
        await create_topics(kafka_bootstrap, [name], partitions=partitions)
        created.append(name)
        return name

    yield make
    if created:
        await delete_topics(kafka_bootstrap, created)


def require_tool(name: str, package: str) -> str:
    """The path of command-line tool ``name``; skips the test when it is missing, except under
    CI (``CI`` set), where ``make tools`` should have installed Debian's ``package``: fails."""
    path = shutil.which(name)
    if path is None:
        hint = f"`{name}` not installed (Debian: apt-get install {package}; or `make tools`)"
        if os.environ.get("CI"):
            pytest.fail(f"{hint} under CI")
        pytest.skip(hint)
    return path


def unique_group(prefix: str = "g") -> str:
    """A consumer-group id no other test uses."""
    return f"test.{prefix}.{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def tiny_embed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BERT embedder (mean pooling + Normalize, dim 32, max length 64),
    saved with ``save_pretrained`` so it loads through the real code path."""
    from tests.fixtures.tiny_models import build_tiny_embedder

    return build_tiny_embedder(tmp_path_factory.mktemp("tiny-embed"))


@pytest.fixture(scope="session")
def tiny_classify_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BERT classifier (3 labels in id2label, max length 128)."""
    from tests.fixtures.tiny_models import build_tiny_classifier

    return build_tiny_classifier(tmp_path_factory.mktemp("tiny-classify"))


@pytest.fixture(scope="session")
def tiny_prompt_embed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny_embed_dir``'s model (same weights) with named prompts (``PROMPTS``)."""
    from tests.fixtures.tiny_models import PROMPTS, build_tiny_embedder

    return build_tiny_embedder(tmp_path_factory.mktemp("tiny-prompt-embed"), prompts=PROMPTS)


@pytest.fixture(scope="session")
def tiny_raw_embed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights and prompts without a ``Normalize`` module, and ``query`` as the
    model's ``default_prompt_name``."""
    from tests.fixtures.tiny_models import PROMPTS, build_tiny_embedder

    return build_tiny_embedder(
        tmp_path_factory.mktemp("tiny-raw-embed"),
        normalize=False,
        prompts=PROMPTS,
        default_prompt_name="query",
    )
