"""The command blocks of README.md, docs/CONTRACT.md and the guides work as written.

Every fenced block in those files is one of:

- **run** (the default for ``bash`` and ``python``): executed here, against the suite's broker;
- **parse** (``<!-- docs-test: parse (why) -->`` on the line before): long runs; each
  ``kbatch …`` line is parsed by kbatch's own CLI (commands, flags and values checked);
- **skip** (``<!-- docs-test: skip (why) -->``): needs what the suite cannot have (a Spring
  application, CI running itself);
- ``text``: a diagram, not a command.

A new block that is none of these fails :func:`test_every_block_is_run_parsed_or_marked`.

How the run blocks meet the suite's broker and stay off other tests' topics, without editing
their text: kbatch commands read ``KBATCH_*`` variables (bootstrap, topics, group, metrics
port, broker port); literal ``localhost:9092`` and topic names in the kcat and Python examples
are replaced by the suite's bootstrap and fresh topic names (:func:`_substitute`). In the
README quick start, ``make setup`` and ``source .venv/bin/activate`` meet the environment the
suite already runs in: ``make`` targets are checked with ``make -n`` and ``.venv`` is this
interpreter's environment. Long-running commands inside run blocks: the quick start's
``kbatch serve &`` is stopped by the block itself (``kill %1; wait %1``); the kcat reply watch
is started in the background and stopped once it printed the reply.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from consumer.kafka.admin import create_topics, delete_topics
from tests.conftest import require_tool, unique_group
from tests.integration.harness import ServeProcess, free_port, poll_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOCS = (
    "README.md",
    "docs/CONTRACT.md",
    "docs/clients.md",
    "docs/backfill.md",
    "docs/hosts.md",
)
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
_MARKER = re.compile(r"<!--\s*docs-test:\s*(skip|parse)\s*\((.+)\)\s*-->")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, body and test mode."""

    doc: str
    line: int
    lang: str
    body: str
    mode: str  # run | parse | skip | text
    reason: str = ""

    @property
    def first_line(self) -> str:
        return self.body.splitlines()[0]


def doc_blocks() -> list[Block]:
    """Every fenced block of :data:`DOCS` with its mode (from the marker on the line before)."""
    out = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        for m in _FENCE.finditer(text):
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = _MARKER.fullmatch(before.strip())
            lang = m.group(1)
            mode = "text" if lang == "text" else marker.group(1) if marker else "run"
            out.append(
                Block(
                    doc, text.count("\n", 0, m.start()) + 1, lang, m.group(2), mode,
                    marker.group(2) if marker else "",
                )
            )  # fmt: skip
    return out


def _run_block(doc: str, first_line: str) -> Block:
    """The one run block of ``doc`` starting with ``first_line`` (skip-marked blocks may start
    alike); none (e.g. the block was marked skip) fails the test."""
    runs = [b for b in doc_blocks() if b.doc == doc and b.first_line == first_line]
    (block,) = [b for b in runs if b.mode == "run"] or runs
    assert block.mode == "run", block
    return block


# The run blocks and the test that runs each: a new run block must be added here.
QUICK_START = (
    "README.md",
    "make setup                          # .venv with kbatch and its dev tools",
)
README_PYTHON = ("README.md", "import asyncio")
PYTHON_CLIENT = ("docs/CONTRACT.md", "import asyncio")
KCAT = (
    "docs/CONTRACT.md",
    "# Watch replies: key, headers (kbatch-status, correlation id) and the JSON value.",
)
OPTIONS_PYTHON = (
    "docs/CONTRACT.md",
    '# Embed options through kbatch\'s client (the model must declare a "query" prompt).',
)
OPTIONS_KCAT = (
    "docs/CONTRACT.md",
    "kbatch topics create my.replies      # the reply topic must exist: brokers create none on use",
)


def test_every_block_is_run_parsed_or_marked() -> None:
    blocks = doc_blocks()
    run = {(b.doc, b.first_line) for b in blocks if b.mode == "run"}
    assert run == {QUICK_START, README_PYTHON, PYTHON_CLIENT, KCAT, OPTIONS_PYTHON, OPTIONS_KCAT}, (
        "a command block is neither run by this module nor marked: add a test or a "
        "<!-- docs-test: parse|skip (why) --> line"
    )
    for b in blocks:
        assert b.mode == "text" or b.lang in {"bash", "python", "yaml", "java"}, b
        assert b.mode != "run" or b.lang in {"bash", "python"}, b
        assert b.mode not in {"skip", "parse"} or len(b.reason) > 10, b
    assert any(b.mode == "parse" for b in blocks)


# ---- parse blocks --------------------------------------------------------------------------


def _commands(body: str) -> list[list[str]]:
    """The shell words of each command line (continuations joined, comments dropped)."""
    joined = body.replace("\\\n", " ")
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


def _parse_kbatch(args: list[str]) -> str:
    """Parse ``kbatch ARGS`` like the console script would, without running the command;
    the command's name. Raises click.UsageError for an unknown command, flag or bad value."""
    from consumer.cli import cli

    ctx = cli.make_context("kbatch", list(args))
    cmd: click.Command = cli
    while isinstance(cmd, click.Group):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest and cmd.invoke_without_command:  # `kbatch backfill --…`: the group runs
            break
        name, sub, rest = cmd.resolve_command(ctx, rest)
        assert name is not None and sub is not None
        cmd, ctx = sub, sub.make_context(name, rest, parent=ctx)
    return str(cmd.name)


def test_parse_blocks_are_valid_kbatch_command_lines() -> None:
    parsed = []
    for block in (b for b in doc_blocks() if b.mode == "parse"):
        for words in _commands(block.body):
            assert words[0] == "kbatch", f"{block.doc}:{block.line}: only kbatch lines parse"
            parsed.append(_parse_kbatch(words[1:]))
    assert {"request", "load", "backfill", "engine", "e2e"} <= set(parsed)


def test_a_wrong_flag_in_a_parse_block_would_fail() -> None:
    with pytest.raises(click.UsageError, match="--rat"):
        _parse_kbatch(["load", "--rat", "5"])


# ---- run blocks ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Names:
    """Fresh topic names standing in for the documented ones."""

    requests: str
    replies: str
    dlq: str
    group: str
    mine: str  # my.replies / my-app.replies
    mine_msgpack: str  # my.msgpack.replies

    @classmethod
    def fresh(cls) -> Names:
        base = unique_group("docs")
        return cls(
            f"{base}.requests", f"{base}.replies", f"{base}.requests.dlq", base,
            f"{base}.my.replies", f"{base}.my.msgpack.replies",
        )  # fmt: skip

    def env(self, bootstrap: str) -> dict[str, str]:
        return {
            **os.environ,
            "KBATCH_BOOTSTRAP": bootstrap,
            "KBATCH_REQUEST_TOPIC": self.requests,
            "KBATCH_REPLY_TOPIC": self.replies,
            "KBATCH_DLQ_TOPIC": self.dlq,
            "KBATCH_GROUP_ID": self.group,
            "KBATCH_METRICS_PORT": str(free_port()),
            "KBATCH_TORCH_THREADS": "1",
        }

    @property
    def allowed(self) -> str:
        """``--allowed-reply-topics`` for the documented ``my.*`` reply topics."""
        return re.escape(self.group) + r"\.my\..*"

    @property
    def all(self) -> list[str]:
        return [self.requests, self.replies, self.dlq, self.mine, self.mine_msgpack]


def _substitute(text: str, bootstrap: str, names: Names) -> str:
    """The documented bootstrap and topic names → the suite's, in one pass (longest first)."""
    table = {
        "localhost:9092": bootstrap,
        "kbatch.requests.dlq": names.dlq,
        "kbatch.requests": names.requests,
        "kbatch.replies": names.replies,
        "my.msgpack.replies": names.mine_msgpack,
        "my-app.replies": names.mine,
        "my.replies": names.mine,
    }
    pattern = "|".join(re.escape(k) for k in sorted(table, key=len, reverse=True))
    return re.sub(pattern, lambda m: table[m.group(0)], text)


@pytest.fixture
def names(kafka_bootstrap: str) -> Iterator[Names]:
    fresh = Names.fresh()
    yield fresh
    asyncio.run(delete_topics(kafka_bootstrap, fresh.all))


def _bash(
    script: str, cwd: Path, env: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip


def test_readme_quick_start(tmp_path: Path, kafka_bootstrap: str, names: Names) -> None:
    """make setup → activate → broker start → serve & → request → kill: the request is
    answered ok and serve drains and exits 0. Uses the packaged MiniLM, as written."""
    if os.environ.get("KBATCH_TEST_BOOTSTRAP"):
        pytest.skip("the quick start starts a local broker: needs the suite's own LocalBroker")
    block = _run_block(*QUICK_START)
    (tmp_path / ".venv").symlink_to(sys.prefix)
    # make: the targets exist and are up to date or buildable; the suite runs in the result.
    prelude = f'make() {{ command make -C {shlex.quote(str(ROOT))} -n "$@" >/dev/null; }}\n'
    env = names.env(kafka_bootstrap)
    env["KBATCH_BROKER_PORT"] = kafka_bootstrap.rsplit(":", 1)[1]
    out = _bash(prelude + block.body, tmp_path, env, timeout_s=240)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert '"status": "ok"' in out.stdout, out.stdout


def _serving(tmp_path: Path, bootstrap: str, names: Names, model: Path) -> Iterator[ServeProcess]:
    """kbatch serve on the fresh topics (it creates them) with ``model``, until the test ends."""
    server = ServeProcess.start(
        tmp_path, bootstrap=bootstrap, request_topic=names.requests,
        reply_topic=names.replies, dlq_topic=names.dlq, group_id=names.group, model=str(model),
        extra=["--allowed-reply-topics", names.allowed],  # the documented my.replies
    )  # fmt: skip
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
def served(
    tmp_path: Path, kafka_bootstrap: str, names: Names, tiny_embed_dir: Path
) -> Iterator[ServeProcess]:
    """kbatch serve with the tiny embedder."""
    yield from _serving(tmp_path, kafka_bootstrap, names, tiny_embed_dir)


def _run_python_block(
    where: tuple[str, str], tmp_path: Path, bootstrap: str, names: Names
) -> subprocess.CompletedProcess[str]:
    """Run a Python block as a script on the suite's broker and fresh topics, after creating
    its reply topic (as the block's comment says); it must exit 0."""
    block = _run_block(*where)
    asyncio.run(create_topics(bootstrap, [names.mine]))
    script = tmp_path / "block.py"
    script.write_text(_substitute(block.body, bootstrap, names))
    out = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=90,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_readme_python_client(
    tmp_path: Path, kafka_bootstrap: str, names: Names, served: ServeProcess
) -> None:
    """The README's client example: one request on the default reply topic, answered ok."""
    out = _run_python_block(README_PYTHON, tmp_path, kafka_bootstrap, names)
    assert out.stdout.startswith("ok ("), out.stdout


def test_contract_python_client(
    tmp_path: Path, kafka_bootstrap: str, names: Names, served: ServeProcess
) -> None:
    out = _run_python_block(PYTHON_CLIENT, tmp_path, kafka_bootstrap, names)
    assert "embedding=" in out.stdout and "error" not in out.stdout, out.stdout


def test_contract_kcat_examples(
    tmp_path: Path, kafka_bootstrap: str, names: Names, served: ServeProcess
) -> None:
    """The kcat paragraphs in order; the watch (first, before its topic exists) runs in the
    background and must print the JSON reply; the msgpack example must decode an ok reply."""
    require_tool("kcat", "kcat")
    block = _run_block(*KCAT)
    paragraphs = _substitute(block.body, kafka_bootstrap, names).split("\n\n")
    watch, rest = paragraphs[0], paragraphs[1:]
    assert "-o end" in watch
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out_path, err_path = tmp_path / "watch.out", tmp_path / "watch.err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        watcher = subprocess.Popen(  # stdbuf: line-buffered, as on a terminal
            ["stdbuf", "-oL", "bash", "-e", "-o", "pipefail", "-c", watch],
            cwd=tmp_path, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    try:
        results = []
        for i, paragraph in enumerate(rest):
            results.append(_bash(paragraph, tmp_path, env, timeout_s=90))
            if i == 0:  # the topics exist now: let the watch reach the end before sending
                poll_until(lambda: "Reached end of topic" in err_path.read_text(), 60, "the watch")
        poll_until(lambda: "key=k1" in out_path.read_text(), 60, "the watched reply")
        assert watcher.poll() is None, err_path.read_text()
    finally:
        os.killpg(watcher.pid, signal.SIGTERM)
        watcher.wait(10)
    for paragraph, result in zip(rest, results, strict=True):
        allowed = {0, 1} if "grep -v" in paragraph else {0}
        assert result.returncode in allowed, paragraph + "\n" + result.stderr[-2000:]
    watched = out_path.read_text()
    assert "kbatch-status=ok" in watched and "kafka_correlationId=c-1" in watched, watched
    assert '"status":"ok"' in watched.replace(" ", ""), watched
    decoded = results[-1].stdout
    assert "'status': 'ok'" in decoded and "'embedding'" in decoded, decoded


@pytest.fixture
def served_with_prompts(
    tmp_path: Path, kafka_bootstrap: str, names: Names, tiny_prompt_embed_dir: Path
) -> Iterator[ServeProcess]:
    """kbatch serve with the tiny embedder that declares e5-style prompts."""
    yield from _serving(tmp_path, kafka_bootstrap, names, tiny_prompt_embed_dir)


def test_contract_options_python_client(
    tmp_path: Path, kafka_bootstrap: str, names: Names, served_with_prompts: ServeProcess
) -> None:
    """The embed-options example: a prompt, 16 dimensions as f16le, a binary vector."""
    out = _run_python_block(OPTIONS_PYTHON, tmp_path, kafka_bootstrap, names)
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ok float16 (16,) usage:"), out.stdout
    assert lines[1] == "binary: (32,) bits, packed: 4 bytes on the wire", out.stdout


def test_contract_options_kcat(
    tmp_path: Path, kafka_bootstrap: str, names: Names, served_with_prompts: ServeProcess
) -> None:
    """The embed-options kcat lines: create the reply topic, send, wait for the binary reply."""
    require_tool("kcat", "kcat")
    block = _run_block(*OPTIONS_KCAT)
    env = {
        **names.env(kafka_bootstrap),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    out = _bash(_substitute(block.body, kafka_bootstrap, names), tmp_path, env, timeout_s=90)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    dim, hex_bits = out.stdout.strip().splitlines()[-1].split()
    assert dim == "16" and len(bytes.fromhex(hex_bits)) == 2, out.stdout
