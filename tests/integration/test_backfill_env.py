"""``kbatch backfill`` beside a running ``kbatch serve`` whose settings are exported
(``KBATCH_GROUP_ID``, ``KBATCH_DLQ_TOPIC``), as a shell or a pod has them: the backfill keeps
its own group and dead-letter topic, and is refused serve's live group when given it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from consumer.kafka.admin import delete_topics
from tests.conftest import TopicFactory, unique_group
from tests.integration.harness import KBATCH, ServeProcess, committed_offsets, read_all
from tests.integration.test_backfill import Event, produce_events

pytestmark = pytest.mark.integration


async def test_serves_exported_variables_do_not_steer_a_backfill_and_its_live_group_is_refused(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    req, rep, dlq = await new_topic("req", 2), await new_topic("rep"), await new_topic("dlq")
    source, output = await new_topic("bf-src"), await new_topic("bf-out")
    group = unique_group("live")
    events = [
        Event(0, f"good-{i}".encode(), json.dumps({"text": f"event {i}"}).encode())
        for i in range(3)
    ]
    await produce_events(kafka_bootstrap, source, [*events, Event(0, b"bad", b"{not json")])
    serve = ServeProcess.start(
        tmp_path, bootstrap=kafka_bootstrap, request_topic=req, reply_topic=rep, dlq_topic=dlq,
        group_id=group, model=str(tiny_embed_dir),
    )  # fmt: skip
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "KBATCH_BOOTSTRAP": kafka_bootstrap,  # shared: the backfill finds the broker by it
        "KBATCH_GROUP_ID": group,  # serve's
        "KBATCH_DLQ_TOPIC": dlq,  # serve's
    }
    args = [
        KBATCH, "backfill", "--source-topic", source, "--output-topic", output,
        "--model", str(tiny_embed_dir), "--text-field", "text", "--torch-threads", "1",
        "--commit-interval-ms", "100", "--json",
    ]  # fmt: skip
    try:
        await asyncio.to_thread(serve.wait_ready)
        run = subprocess.run(args, env=env, capture_output=True, text=True, timeout=180)
        # before: in serve's group, every commit UnknownMemberIdError, "incomplete", exit 1
        assert run.returncode == 0, run.stderr[-3000:]
        refused = subprocess.run(
            [*args, "--group-id", group], env=env, capture_output=True, text=True, timeout=180
        )
        serve_dead = await read_all(kafka_bootstrap, dlq, 1, decode=False)
        own_dead = await read_all(kafka_bootstrap, f"{source}.dlq", 1, decode=False)
        written = await read_all(kafka_bootstrap, output, 1)
        serve_commits = await committed_offsets(kafka_bootstrap, group, source, 1)
    finally:
        serve.stop()
        await delete_topics(kafka_bootstrap, [f"{source}.dlq"])
    summary = json.loads(run.stdout.splitlines()[-1])
    assert summary["complete"] and (summary["ok"], summary["dead_lettered"]) == (3, 1)
    assert "UnknownMemberId" not in run.stderr
    assert [r.key for r in own_dead] == [b"bad"]  # <source>.dlq, not serve's
    assert serve_dead == []
    assert serve_commits == {0: None}  # nothing committed under serve's group
    # serve's live group given on purpose: one error line, nothing read or written
    errors = [line for line in refused.stderr.splitlines() if line.startswith("Error:")]
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert len(errors) == 1 and f"{group!r} has 1 live member(s)" in errors[0], refused.stderr
    assert "Traceback" not in refused.stderr
    assert len(written) == 3
