"""``kbatch request TEXT``: one request/reply round trip, the reply printed as JSON.

Also home of :func:`topic_options`, the ``--bootstrap``/``--request-topic``/``--reply-topic``
flags that ``kbatch request`` and ``kbatch load`` share with ``kbatch serve`` (same names,
same ``KBATCH_*`` variables, defaults read from :class:`consumer.config.ServeSettings`).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar

import click
from pydantic import ValidationError
from rich_click import RichCommand

from consumer.cli.client_security import SECURITY_FIELDS, client_kafka_options, security_options
from consumer.cli.options import POSITIVE, flag, option
from consumer.config import ServeSettings
from schemas.models import AGGREGATIONS, TASKS

F = TypeVar("F", bound=Callable[..., Any])

EXIT_NOT_OK = 1
"""Exit status when the reply came but its status is ``error`` or ``expired``."""


def _default(name: str) -> str:
    value = ServeSettings.default_of(name)
    assert isinstance(value, str)
    return value


def topic_options(func: F) -> F:
    """Add ``--bootstrap``, ``--request-topic``, ``--reply-topic`` as ``kbatch serve`` has them."""
    for name, help_text in reversed(
        [
            ("bootstrap", "Kafka bootstrap servers, comma-separated."),
            ("request_topic", "Topic kbatch serve consumes."),
            ("reply_topic", "Topic the replies are asked for (kafka_replyTopic); must exist."),
        ]
    ):
        func = click.option(
            "--" + name.replace("_", "-"),
            name,
            default=_default(name),
            show_default=True,
            envvar=f"KBATCH_{name.upper()}",
            help=help_text + f" (env KBATCH_{name.upper()})",
        )(func)
    return func


def encoding_option(func: F) -> F:
    """``--encoding msgpack|json`` (the reply comes back in the same)."""
    return click.option(
        "--encoding",
        type=click.Choice(["msgpack", "json"]),
        default="msgpack",
        show_default=True,
        help="Request encoding; the reply uses the same.",
    )(func)


def read_text(text: str | None, text_file: BinaryIO | None) -> str:
    """The request's text: the TEXT argument, or stdin for ``-``, or ``--text-file``'s content
    (``-``: stdin), without its trailing newlines (as the shell's ``$(cat FILE)``: ``echo`` and
    editors end a file with one).

    Raises:
        click.UsageError: both or neither of TEXT and ``--text-file``.
        click.BadParameter: the file is not UTF-8.
    """
    if text is not None and text_file is not None:
        raise click.UsageError("give the text once: TEXT, or - for stdin, or --text-file PATH")
    if text is None and text_file is None:
        raise click.UsageError("give the text as TEXT, or - for stdin, or --text-file PATH")
    if text is not None and text != "-":
        return text
    source: BinaryIO = text_file or sys.stdin.buffer
    hint = "--text-file" if text_file is not None else "TEXT"
    try:
        return source.read().decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as err:
        raise click.BadParameter(f"not UTF-8: {err}", param_hint=hint) from None


@click.command("request", cls=RichCommand)
@click.argument("text", required=False)
@option(
    "--text-file",
    type=click.File("rb"),
    metavar="PATH",
    help="Read the text from this file (- for stdin) instead of TEXT; trailing newlines "
    "are dropped.",
)
@option(
    "--key",
    help="Idempotency key (default: a random one): a key in use for another text within the "
    "server's dedup window is answered idempotency_key_reused.",
)
@option(
    "--timeout-s",
    type=POSITIVE,
    default=30.0,
    help="Seconds to wait for the reply, retries included.",
)
@option(
    "--retries",
    type=click.IntRange(min=0),
    default=0,
    help="Re-send the same key this many times while unanswered (the server dedups).",
)
@option(
    "--task",
    type=click.Choice(list(TASKS)),
    help="The request's task (default: none, whatever the served model does; a task other "
    "than the model's is answered unsupported_task).",
)
@option(
    "--deadline-after-ms",
    type=click.IntRange(min=0),
    help="Set deadline_ms this many ms from now: later, the server answers expired.",
)
@option("--meta", help="A JSON object echoed in the reply.")
@option("--truncate/--no-truncate", help="Over-length policy.")
@option(
    "--dimensions",
    type=click.IntRange(min=1),
    help="Keep the first N values of the embedding (then re-normalised if normalised).",
)
@option("--normalize/--no-normalize", help="L2-normalise; default: as the model says.")
@option("--prompt-name", help="A prompt of the model's config, e.g. query.")
@option(
    "--encoding-format",
    type=click.Choice(["float", "f32le", "f16le", "binary"]),
    help="How the embedding (or sparse vector: not binary) travels; printed as lists.",
)
@option(
    "--document",
    "documents",
    multiple=True,
    help="rerank: a document to score against TEXT (the query); repeat, 1 to 64.",
)
@option("--top-n", type=click.IntRange(min=1), help="rerank: the best N too.")
@option("--top-k", type=click.IntRange(min=1), help="sparse: keep the K largest weights.")
@option(
    "--aggregation",
    type=click.Choice(list(AGGREGATIONS)),
    help="token-classify: how tokens become entities (default simple).",
)
@option("--redact/--no-redact", help="token-classify: also the text with [LABEL]s.")
@option(
    "--chunk-max-tokens",
    type=click.IntRange(min=4),
    help="embed (contract 1.3): embed in chunks of at most N tokens (prompt and special "
    "tokens included).",
)
@option(
    "--chunk-overlap",
    type=click.IntRange(min=0),
    help="embed: tokens consecutive chunks share (with --chunk-max-tokens; default 0).",
)
@option(
    "--chunk-output",
    type=click.Choice(["pooled", "chunks"]),
    help="embed: one pooled vector (default) or every chunk's with its start/end.",
)
@option(
    "--priority",
    type=click.Choice(["live", "bulk"]),
    help="live (the server's default) or bulk: computed in the capacity live requests leave "
    "idle (contract 1.2).",
)
@flag("--full", help="Print the record's metadata and latency too.")
@encoding_option
@topic_options
@option(
    "--dlq-topic",
    default=_default("dlq_topic"),
    envvar="KBATCH_DLQ_TOPIC",
    help="The server's dead-letter topic, refused as --reply-topic: a dead letter is not a "
    "reply (env KBATCH_DLQ_TOPIC)",
)
@security_options
def request_command(
    text: str | None,
    text_file: BinaryIO | None,
    key: str | None,
    timeout_s: float,
    retries: int,
    deadline_after_ms: int | None,
    meta: str | None,
    documents: tuple[str, ...],
    chunk_max_tokens: int | None,
    chunk_overlap: int | None,
    chunk_output: str | None,
    full: bool,
    encoding: str,
    bootstrap: str,
    request_topic: str,
    reply_topic: str,
    dlq_topic: str,
    **fields: Any,
) -> None:
    """Send TEXT to kbatch serve and print its reply as JSON.

    TEXT "-" reads the text from stdin (as --text-file - does); --text-file PATH reads it from
    a file (curl's -d @PATH; a TEXT starting with @ is sent as it is).

    Exit status: 0 for an ok reply, 1 for an error or expired reply (still printed) or no
    reply within --timeout-s.
    """
    import time

    from producer_tools.client import ClientError, RequestReplyClient
    from schemas.codec import Encoding

    input_text = read_text(text, text_file)
    meta_obj = _parse_meta(meta)
    security = {name: fields.pop(name) for name in SECURITY_FIELDS if name in fields}
    kafka_options = client_kafka_options(bootstrap, security)
    if deadline_after_ms is not None:
        fields["deadline_ms"] = int(time.time() * 1000) + deadline_after_ms
    chunk_fields = {"max_tokens": chunk_max_tokens, "overlap": chunk_overlap,
                    "output": chunk_output}  # fmt: skip
    chunking = {k: v for k, v in chunk_fields.items() if v is not None} or None

    async def call() -> dict[str, Any]:
        async with RequestReplyClient(
            bootstrap=bootstrap,
            request_topic=request_topic,
            reply_topic=reply_topic,
            encoding=Encoding.JSON if encoding == "json" else Encoding.MSGPACK,
            start_timeout_s=timeout_s,  # the wait for the topics is bounded by --timeout-s too
            kafka_options=kafka_options,
            dead_letter_topic=dlq_topic,
        ) as client:
            envelope = await client.request(
                input_text,
                key,
                timeout_s=timeout_s,
                retries=retries,
                meta=meta_obj,
                documents=list(documents) or None,
                chunking=chunking,
                **fields,  # --task, --truncate, --dimensions …: click.Choice keeps the literals
            )
        out = envelope.to_json()
        return out if full else out["reply"]

    try:
        result = asyncio.run(call())
    except ClientError as err:
        raise click.ClickException(str(err)) from err
    except ValidationError as err:  # the request breaks the contract (schemas.records.Request)
        raise click.UsageError(f"not a valid request: {_problems(err)}") from err
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    click.echo(json.dumps(result))
    status = result["reply"]["status"] if full else result["status"]
    if status != "ok":
        raise SystemExit(EXIT_NOT_OK)


def _parse_meta(meta: str | None) -> dict[str, Any] | None:
    """``--meta``'s JSON object (None when not given).

    Raises:
        click.BadParameter: not JSON, or JSON but not an object.
    """
    if meta is None:
        return None
    try:
        meta_obj = json.loads(meta)
    except json.JSONDecodeError as err:
        raise click.BadParameter(f"not JSON: {err}", param_hint="--meta") from err
    if not isinstance(meta_obj, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--meta")
    return meta_obj


def _problems(err: ValidationError) -> str:
    """``field: message (got value)`` per problem of a request the contract refuses."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']} (got {e.get('input')!r})"
        for e in err.errors()
    )
