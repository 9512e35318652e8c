"""``kbatch demo``: the main job on real input, start to finish, in a few minutes.

1. make sure the local broker answers (``kbatch broker start`` semantics, idempotent);
2. create demo topics of its own (deleted at the end);
3. start ``kbatch serve --model minilm`` as a subprocess and wait for ``/readyz``;
4. drive it with the open-loop load generator on the VADER texts: a steady phase, then a pulse;
5. print both reports and a few sample replies;
6. SIGTERM the server (it drains and commits) and clean up.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from consumer.broker.local import LocalBroker
from consumer.kafka.admin import create_topics, delete_topics
from producer_tools.client import RequestReplyClient
from producer_tools.corpus import Text, load_vader
from producer_tools.load import LoadOptions, run_load, write_plots
from producer_tools.report import print_report, report_console


def sample_texts(texts: list[Text], n: int = 3) -> list[str]:
    """The first text of each of the first ``n`` VADER sources (a tweet, a movie review, a
    news snippet…), for the demo's sample replies."""
    first: dict[str, str] = {}
    for t in texts:
        if t.text.strip():
            first.setdefault(t.source, t.text)
    return list(first.values())[:n]


@dataclass(frozen=True)
class DemoOptions:
    """What the demo runs; the defaults take about two minutes after setup on 2 cores."""

    steady_rate_per_s: float = 30.0
    steady_s: float = 30.0
    pulse_base_per_s: float = 15.0
    pulse_factor: float = 6.0
    pulse_s: float = 30.0
    plots_dir: Path | None = None
    broker_port: int = 9092
    ready_timeout_s: float = 180.0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it; nothing holds it afterwards)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_ok(url: str) -> bool:
    """Whether ``url`` answers HTTP 200 within 2 s (a ``kbatch serve``'s ``/readyz``)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except OSError:  # urllib.error.URLError included
        return False


def _start_server(
    bootstrap: str, topics: dict[str, str], metrics_port: int, log_path: Path
) -> subprocess.Popen[bytes]:
    kbatch = str(Path(sys.executable).with_name("kbatch"))
    args = [
        kbatch, "serve",
        "--bootstrap", bootstrap,
        "--request-topic", topics["requests"],
        "--reply-topic", topics["replies"],
        "--dlq-topic", topics["dlq"],
        "--group-id", f"kbatch-demo-{uuid.uuid4().hex[:6]}",
        "--model", "minilm",
        "--task", "embed",
        "--max-wait-ms", "10",
        "--metrics-port", str(metrics_port),
    ]  # fmt: skip
    log = log_path.open("wb")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})


async def _samples(
    bootstrap: str, topics: dict[str, str], texts: list[str]
) -> list[dict[str, Any]]:
    out = []
    async with RequestReplyClient(
        bootstrap=bootstrap, request_topic=topics["requests"], reply_topic=topics["replies"]
    ) as client:
        for i, text in enumerate(texts):
            env = await client.request(text, key=f"demo-sample-{i}", timeout_s=60)
            reply = env.reply.model_dump(mode="json")
            embedding = (reply.get("result") or {}).get("embedding") or []
            reply["result"] = {
                "dim": (reply.get("result") or {}).get("dim"),
                "embedding[:4]": [round(x, 4) for x in embedding[:4]],
            }
            out.append({"text": text, "latency_ms": round(env.latency_s * 1000, 1), "reply": reply})
    return out


def run_demo(opts: DemoOptions, console: Console | None = None) -> int:
    """Run the demo; the exit code (0 when every phase answered without errors)."""
    console = console or report_console()
    bootstrap = LocalBroker(port=opts.broker_port).start()
    console.print(f"[bold]broker[/] answering at {bootstrap}")
    suffix = uuid.uuid4().hex[:6]
    topics = {
        "requests": f"kbatch.demo.{suffix}.requests",
        "replies": f"kbatch.demo.{suffix}.replies",
        "dlq": f"kbatch.demo.{suffix}.dlq",
    }
    asyncio.run(create_topics(bootstrap, [topics["requests"]], partitions=4))
    asyncio.run(create_topics(bootstrap, [topics["replies"], topics["dlq"]], partitions=1))
    metrics_port = free_port()
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"kbatch-demo-{suffix}.log"
    server = _start_server(bootstrap, topics, metrics_port, log_path)
    console.print(f"[bold]kbatch serve[/] pid {server.pid}, log {log_path}, loading MiniLM…")
    failures = 0
    try:
        deadline = time.monotonic() + opts.ready_timeout_s
        while not http_ok(f"http://127.0.0.1:{metrics_port}/readyz"):
            if server.poll() is not None or time.monotonic() > deadline:
                console.print(f"[red]kbatch serve did not get ready[/]; see {log_path}")
                return 1
            time.sleep(0.5)
        console.print(f"ready: metrics on http://127.0.0.1:{metrics_port}/metrics\n")
        corpus = load_vader()
        texts = [t.text for t in corpus if t.text.strip()]
        common: dict[str, Any] = {
            "bootstrap": bootstrap,
            "request_topic": topics["requests"],
            "reply_topic": topics["replies"],
            "texts": texts,
            "metrics_url": f"http://127.0.0.1:{metrics_port}/metrics",
            "warmup_s": 3.0,
        }
        phases = {
            "steady": LoadOptions(
                pattern="constant",
                rate_per_s=opts.steady_rate_per_s,
                duration_s=opts.steady_s,
                **common,
            ),
            "pulse": LoadOptions(
                pattern="pulse",
                rate_per_s=opts.pulse_base_per_s,
                duration_s=opts.pulse_s,
                burst_factor=opts.pulse_factor,
                burst_s=3.0,
                burst_every_s=15.0,
                **common,
            ),
        }
        for name, load_opts in phases.items():
            console.rule(f"{name} phase")
            run = asyncio.run(run_load(load_opts, progress=True))
            print_report(run.report, console)
            summary = run.report["summary"]
            failures += int(summary.get("errors", 0)) + int(summary.get("timeouts", 0))
            if opts.plots_dir is not None:
                for path in write_plots(run, opts.plots_dir, f"demo_{name}"):
                    console.print(f"plot: {path}")
        console.rule("sample replies")
        for sample in asyncio.run(_samples(bootstrap, topics, sample_texts(corpus))):
            console.print_json(json.dumps(sample))
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            code = server.wait(timeout=90)
            console.print(f"kbatch serve drained and exited with {code}")
            failures += int(code != 0)
        asyncio.run(delete_topics(bootstrap, list(topics.values())))
    if failures == 0:
        log_path.unlink(missing_ok=True)  # kept only when something went wrong
    return 0 if failures == 0 else 1
