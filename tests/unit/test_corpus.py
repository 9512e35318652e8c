"""The corpus reader on a synthetic sdist (no network): parsing, joining, files, sampling."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from producer_tools import corpus

GROUND_TRUTH = {
    "tweets_GroundTruth.txt": "1\t2.7\tSo lucky.\r\n2\t1.4\tYay. Another one.\r\nbad line\r\n",
    "movieReviewSnippets_GroundTruth.txt": "1\t2.2\tThe Rock is destined…\r\n3\t-0.6\t \r\n",
    "nytEditorialSnippets_GroundTruth.txt": (
        "1_1\t0.4\tFirst.\r\n1_2\t0.1\tSecond.\r\n2_1\t1\tOther.\r\n"
    ),
    "amazonReviewSnippets_GroundTruth.txt": "\ufeff7_1\t-0.9\tNo picture.\r\n7_2\t-0.1\tJunk.\r\n",
}


def _tar(files: dict[str, bytes], prefix: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{prefix}/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def sdist(tmp_path: Path) -> Path:
    inner = _tar({k: v.encode() for k, v in GROUND_TRUTH.items()}, "hutto_ICWSM_2014")
    outer = _tar(
        {"additional_resources/hutto_ICWSM_2014.tar.gz": inner, "setup.py": b""},
        "vaderSentiment-3.3.2",
    )
    path = tmp_path / corpus.VADER_SDIST
    path.write_bytes(outer)
    return path


def test_reads_every_source_and_joins_documents(sdist: Path) -> None:
    by_source = corpus.read_vader_sdist(sdist)
    assert set(by_source) == set(corpus.VADER_SOURCES)
    assert [t.text for t in by_source["tweets"]] == ["So lucky.", "Yay. Another one."]
    assert [t.text for t in by_source["movie"]] == ["The Rock is destined…"]  # empty skipped
    assert [(t.ref, t.text) for t in by_source["nyt_docs"]] == [
        ("1", "First. Second."),
        ("2", "Other."),
    ]
    assert [(t.ref, t.text) for t in by_source["amazon_docs"]] == [("7", "No picture. Junk.")]


def test_load_vader_uses_the_cached_sdist(sdist: Path) -> None:
    texts = corpus.load_vader(("tweets", "nyt_docs"), cache_dir=sdist.parent)
    assert [t.source for t in texts] == ["tweets", "tweets", "nyt_docs", "nyt_docs"]
    with pytest.raises(corpus.CorpusError, match="unknown"):
        corpus.load_vader(("nope",), cache_dir=sdist.parent)


def test_a_broken_archive_is_a_corpus_error(tmp_path: Path) -> None:
    bad = tmp_path / corpus.VADER_SDIST
    bad.write_bytes(_tar({"setup.py": b""}, "vaderSentiment-3.3.2"))
    with pytest.raises(corpus.CorpusError, match="hutto"):
        corpus.read_vader_sdist(bad)


def test_load_file_jsonl_and_text(tmp_path: Path) -> None:
    jl = tmp_path / "a.jsonl"
    jl.write_text('{"text": "one"}\n\n"two"\n{"text": "three", "x": 1}\n')
    assert [t.text for t in corpus.load_file(jl)] == ["one", "two", "three"]
    txt = tmp_path / "b.txt"
    txt.write_text("alpha\n\nbeta\r\n")
    assert [t.text for t in corpus.load_file(txt)] == ["alpha", "beta"]
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"other": 1}\n')
    with pytest.raises(corpus.CorpusError, match="text"):
        corpus.load_file(bad)


def test_sample_is_reproducible() -> None:
    pool = [corpus.Text("s", str(i), f"t{i}") for i in range(10)]
    assert corpus.sample(pool, 5, seed=3) == corpus.sample(pool, 5, seed=3)
    assert len(set(corpus.sample(pool, 10))) == 10
    assert len(corpus.sample(pool, 25)) == 25
    with pytest.raises(ValueError, match="empty"):
        corpus.sample([], 1)
