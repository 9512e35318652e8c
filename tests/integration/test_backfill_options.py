"""``kbatch backfill`` with the embed option flags of contract 1.1, end to end: the real
command, the real broker, the tiny embedder with prompts, sentence-transformers as reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from schemas.embedding import decode_embedding
from schemas.models import EmbedResult
from tests.conftest import TopicFactory, unique_group
from tests.integration.harness import read_all
from tests.integration.test_backfill import Event, backfill_args, produce_events, run_backfill

pytestmark = pytest.mark.integration


async def test_backfill_applies_the_options_to_every_record(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_prompt_embed_dir: Path
) -> None:
    source, output, dlq = [await new_topic(n) for n in ("bfo-src", "bfo-out", "bfo-dlq")]
    texts = [f"backfilled text number {i}" for i in range(3)]
    await produce_events(
        kafka_bootstrap,
        source,
        [Event(0, f"k{i}".encode(), t.encode()) for i, t in enumerate(texts)],
    )
    args = backfill_args(
        kafka_bootstrap, source, output, dlq, unique_group("bfo"), tiny_prompt_embed_dir,
        "--prompt-name", "query", "--dimensions", "16", "--encoding-format", "f16le",
    )  # fmt: skip
    run = run_backfill(args, tmp_path / "backfill.log")
    assert run.code == 0, run.log[-3000:]

    st = SentenceTransformer(str(tiny_prompt_embed_dir), device="cpu")
    expected = st.encode(texts, prompt_name="query", truncate_dim=16, normalize_embeddings=True)
    written = {r.key: r.reply for r in await read_all(kafka_bootstrap, output, partitions=1)}
    assert len(written) == 3
    for i in range(3):
        result = written[f"k{i}".encode()].result
        assert isinstance(result, EmbedResult) and (result.format, result.dim) == ("f16le", 16)
        vector = decode_embedding(result.embedding, "f16le", 16)
        np.testing.assert_allclose(vector, expected[i].astype(np.float16), atol=1e-3)

    too_many = run_backfill(
        [*args[:-6], "--dimensions", "999", "--group-id", unique_group("bfo")],
        tmp_path / "too-many.log",
    )
    assert too_many.code == 2 and "dimensions is 999" in too_many.log
