"""Real texts for benchmarks and load tests: the VADER sentiment corpus, or any JSONL/text file.

The VADER corpus (Hutto & Gilbert, ICWSM 2014) ships inside the ``vaderSentiment==3.3.2``
sdist as a nested tarball ``additional_resources/hutto_ICWSM_2014.tar.gz``. Its four
``*_GroundTruth.txt`` files hold one snippet per line, ``id<TAB>score<TAB>text``:

==========  ========  =====================================================
source      snippets  shape
==========  ========  =====================================================
tweets         4,200  short (median ≈ 20 tokens)
movie         10,605  one-sentence reviews
nyt            5,190  editorial sentences, id ``doc_sentence`` (498 documents)
amazon         3,708  review sentences, id ``doc_sentence`` (300 documents)
==========  ========  =====================================================

The NYT and Amazon sentences joined back into their documents (by the id before ``_``) are
the long tail (hundreds of tokens, beyond a 256-token model limit). The sdist is fetched once
with ``pip download`` into :data:`DEFAULT_CACHE_DIR` and read in place with :mod:`tarfile`.

No Kafka and no torch here: this module only reads files (and runs pip once).
"""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

VADER_VERSION = "3.3.2"
VADER_SDIST = f"vaderSentiment-{VADER_VERSION}.tar.gz"
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "kbatch" / "corpus"

_INNER_TARBALL = "additional_resources/hutto_ICWSM_2014.tar.gz"
_SNIPPET_FILES = {
    "tweets": "tweets_GroundTruth.txt",
    "movie": "movieReviewSnippets_GroundTruth.txt",
    "nyt": "nytEditorialSnippets_GroundTruth.txt",
    "amazon": "amazonReviewSnippets_GroundTruth.txt",
}
_JOINED_SOURCES = ("nyt", "amazon")
#: Every source name :func:`load_vader` knows: the four snippet files and the joined documents.
VADER_SOURCES: tuple[str, ...] = (*_SNIPPET_FILES, "nyt_docs", "amazon_docs")


class CorpusError(RuntimeError):
    """The corpus could not be fetched or parsed (pip failed, the archive is not as expected)."""


@dataclass(frozen=True, slots=True)
class Text:
    """One corpus text: ``source`` (e.g. ``"tweets"``, ``"nyt_docs"``), its ``ref`` id there."""

    source: str
    ref: str
    text: str


def fetch_vader_sdist(cache_dir: Path = DEFAULT_CACHE_DIR, *, timeout_s: float = 300.0) -> Path:
    """Return the path of the ``vaderSentiment`` sdist, downloading it once into ``cache_dir``.

    Runs ``python -m pip download --no-deps --no-binary :all: vaderSentiment==3.3.2`` (pip's
    own HTTP cache makes a re-download after a cache wipe fast). Raises :class:`CorpusError`
    when pip fails or does not produce the tarball.
    """
    target = cache_dir / VADER_SDIST
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--no-deps",
        "--no-binary",
        ":all:",
        f"vaderSentiment=={VADER_VERSION}",
        "-d",
        str(cache_dir),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CorpusError(f"pip download of vaderSentiment failed: {exc}") from exc
    if proc.returncode != 0 or not target.is_file():
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise CorpusError(f"pip download of vaderSentiment failed (rc={proc.returncode}): {tail}")
    return target


def parse_ground_truth(data: bytes, source: str) -> list[Text]:
    """Parse one ``*_GroundTruth.txt`` file (``id<TAB>score<TAB>text`` per line, CRLF).

    Lines without three tab-separated fields or with an empty text are skipped; a UTF-8 BOM
    and undecodable bytes are tolerated.
    """
    out: list[Text] = []
    for line in data.decode("utf-8-sig", errors="replace").splitlines():
        parts = line.split("\t", 2)
        if len(parts) != 3:
            continue
        ref, _score, text = parts
        text = text.strip()
        if text:
            out.append(Text(source=source, ref=ref.strip(), text=text))
    return out


def join_documents(snippets: Iterable[Text], source: str) -> list[Text]:
    """Join sentence snippets with ids ``doc_sentence`` into one text per ``doc``, in order.

    Sentences keep their file order inside a document; the document order is first appearance.
    """
    docs: dict[str, list[str]] = {}
    for t in snippets:
        doc_id = t.ref.split("_", 1)[0]
        docs.setdefault(doc_id, []).append(t.text)
    return [Text(source=source, ref=d, text=" ".join(parts)) for d, parts in docs.items()]


def read_vader_sdist(sdist: Path) -> dict[str, list[Text]]:
    """Read every VADER source from the sdist tarball, without extracting it to disk.

    Returns ``{source: texts}`` for every name in :data:`VADER_SOURCES`. Raises
    :class:`CorpusError` when the nested archive or a snippet file is missing.
    """
    try:
        with tarfile.open(sdist, "r:gz") as outer:
            inner_member = next(
                (m for m in outer.getmembers() if m.name.endswith(_INNER_TARBALL)), None
            )
            if inner_member is None:
                raise CorpusError(f"{sdist} has no {_INNER_TARBALL}")
            fh = outer.extractfile(inner_member)
            if fh is None:
                raise CorpusError(f"{sdist}: {_INNER_TARBALL} is not a regular file")
            inner_bytes = fh.read()
        files: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(inner_bytes), mode="r:gz") as inner:
            for m in inner.getmembers():
                base = m.name.rsplit("/", 1)[-1]
                if m.isfile() and base in _SNIPPET_FILES.values():
                    member = inner.extractfile(m)
                    if member is not None:
                        files[base] = member.read()
    except (tarfile.TarError, OSError) as exc:
        raise CorpusError(f"cannot read {sdist}: {exc}") from exc
    out: dict[str, list[Text]] = {}
    for source, name in _SNIPPET_FILES.items():
        if name not in files:
            raise CorpusError(f"{sdist}: {name} not found in {_INNER_TARBALL}")
        out[source] = parse_ground_truth(files[name], source)
    for source in _JOINED_SOURCES:
        out[f"{source}_docs"] = join_documents(out[source], f"{source}_docs")
    return out


def load_vader(
    sources: Sequence[str] = VADER_SOURCES, *, cache_dir: Path = DEFAULT_CACHE_DIR
) -> list[Text]:
    """All texts of the given VADER ``sources`` (default: all of them), fetched once and cached.

    The order is the sources' order, then file order. Raises :class:`CorpusError` for an
    unknown source name or a failed fetch.
    """
    unknown = [s for s in sources if s not in VADER_SOURCES]
    if unknown:
        raise CorpusError(f"unknown VADER sources {unknown}; known: {list(VADER_SOURCES)}")
    by_source = read_vader_sdist(fetch_vader_sdist(cache_dir))
    return [t for s in sources for t in by_source[s]]


def load_file(path: Path, *, field: str = "text") -> list[Text]:
    """Texts from a file: JSONL (``.jsonl``/``.ndjson``: objects with ``field``, or strings)
    or plain text (one text per non-empty line).

    Raises :class:`CorpusError` for a JSONL line that is not valid JSON or lacks ``field``.
    """
    out: list[Text] = []
    src = path.name
    jsonl = path.suffix.lower() in {".jsonl", ".ndjson"}
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            if not jsonl:
                out.append(Text(source=src, ref=str(lineno), text=line.rstrip("\r\n")))
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"{path}:{lineno}: not JSON: {exc}") from exc
            if isinstance(obj, str):
                text = obj
            elif isinstance(obj, dict) and isinstance(obj.get(field), str):
                text = obj[field]
            else:
                raise CorpusError(f"{path}:{lineno}: no string field {field!r}")
            out.append(Text(source=src, ref=str(lineno), text=text))
    return out


def sample(texts: Sequence[Text], n: int, *, seed: int = 0) -> list[Text]:
    """``n`` texts drawn uniformly without replacement (with replacement when ``n`` exceeds
    the pool), reproducible from ``seed``. Raises ``ValueError`` for an empty pool or ``n < 0``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not texts:
        raise ValueError("cannot sample from an empty corpus")
    rng = random.Random(seed)
    if n <= len(texts):
        return rng.sample(list(texts), n)
    return [rng.choice(texts) for _ in range(n)]
