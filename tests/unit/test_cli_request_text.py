"""Where ``kbatch request`` reads its text (consumer/cli/request.py ``read_text``): TEXT, ``-``
for stdin, ``--text-file PATH``; the round trip through a broker is in
tests/integration/test_client.py."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, ClassVar

import click
import pytest
from click.testing import CliRunner

from consumer.cli.request import read_text, request_command
from producer_tools import client
from producer_tools.client import ClientError


@pytest.mark.parametrize(
    ("text", "content", "expected"),
    [
        ("as given\n", None, "as given\n"),  # an argument is sent as it is
        ("@not-a-file", None, "@not-a-file"),  # no curl-style @: a mention is text
        (None, b"from a file\n", "from a file"),  # the newline echo and editors add is dropped
        (None, b"two\nlines\r\n\n", "two\nlines"),  # inner newlines kept
        (None, "h\u00e9llo".encode(), "h\u00e9llo"),
    ],
)
def test_the_text_comes_from_the_argument_or_the_file(
    text: str | None, content: bytes | None, expected: str
) -> None:
    assert read_text(text, None if content is None else io.BytesIO(content)) == expected


def test_both_or_neither_is_a_usage_error_and_the_file_must_be_utf8() -> None:
    for text, file, first in [(None, None, "give the text as"), ("t", io.BytesIO(b"f"), "once")]:
        with pytest.raises(click.UsageError, match=f"{first}.*TEXT, or - for stdin, or --text-f"):
            read_text(text, file)
    with pytest.raises(click.BadParameter, match="not UTF-8"):
        read_text(None, io.BytesIO(b"\xff\xfe"))


class _RecordingClient:
    """Stands in for RequestReplyClient: records the text sent, answers with a ClientError."""

    texts: ClassVar[list[str]] = []

    def __init__(self, **_: Any) -> None:
        pass

    async def __aenter__(self) -> _RecordingClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        pass

    async def request(self, text: str, key: object, **_: Any) -> None:
        self.texts.append(text)
        raise ClientError("recorded")


def test_dash_and_text_file_read_stdin_and_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client, "RequestReplyClient", _RecordingClient)
    monkeypatch.setattr(_RecordingClient, "texts", [])
    (tmp_path / "text.txt").write_bytes(b"from the file\n")
    runner = CliRunner()
    for args, stdin in [
        (["-"], "from stdin\n"),
        (["--text-file", "-"], "from stdin too\n"),
        (["--text-file", str(tmp_path / "text.txt")], None),
    ]:
        out = runner.invoke(request_command, args, input=stdin)
        assert out.exit_code == 1 and "recorded" in out.output
    assert _RecordingClient.texts == ["from stdin", "from stdin too", "from the file"]
    both = runner.invoke(request_command, ["t", "--text-file", "-"], input="x")
    assert both.exit_code == 2 and "TEXT, or - for stdin" in both.output
    missing = runner.invoke(request_command, ["--text-file", str(tmp_path / "no")])
    assert missing.exit_code == 2 and "--text-file" in missing.output
    assert len(_RecordingClient.texts) == 3  # neither was sent


def _record_options(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Stand in for the client; the keyword arguments of each request, in order."""
    sent: list[dict[str, Any]] = []

    class _Client(_RecordingClient):
        async def request(self, text: str, key: object, **kwargs: Any) -> None:
            sent.append(kwargs)
            raise ClientError("recorded")

    monkeypatch.setattr(client, "RequestReplyClient", _Client)
    return sent


def test_priority_is_passed_to_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _record_options(monkeypatch)
    runner = CliRunner()
    assert runner.invoke(request_command, ["t", "--priority", "bulk"]).exit_code == 1
    assert runner.invoke(request_command, ["t"]).exit_code == 1
    assert [k["priority"] for k in sent] == ["bulk", None]
    wrong = runner.invoke(request_command, ["t", "--priority", "urgent"])
    assert wrong.exit_code == 2 and len(sent) == 2


def test_chunk_flags_become_the_chunking_option(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _record_options(monkeypatch)
    runner = CliRunner()
    args = ["t", "--chunk-max-tokens", "128", "--chunk-overlap", "16", "--chunk-output", "chunks"]
    assert runner.invoke(request_command, args).exit_code == 1
    assert runner.invoke(request_command, ["t", "--chunk-output", "pooled"]).exit_code == 1
    assert runner.invoke(request_command, ["t"]).exit_code == 1
    assert [k["chunking"] for k in sent] == [
        {"max_tokens": 128, "overlap": 16, "output": "chunks"}, {"output": "pooled"}, None
    ]  # fmt: skip
