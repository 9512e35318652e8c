"""A reply topic where kbatch never replies is refused before anything is sent
(producer_tools/client.py, ``kbatch request``); that a dead letter read is not taken for a reply
is tested with a server in tests/integration/test_client.py."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from consumer.cli.request import request_command
from producer_tools.client import RequestReplyClient


@pytest.mark.parametrize(
    ("reply_topic", "role"),
    [("kbatch.requests", "request"), ("kbatch.requests.dlq", "dead-letter")],
)
def test_the_request_and_dead_letter_topics_are_refused_as_reply_topics(
    reply_topic: str, role: str
) -> None:
    with pytest.raises(ValueError, match=f"is the server's {role} topic, where it never replies"):
        RequestReplyClient(
            bootstrap="127.0.0.1:1",
            request_topic="kbatch.requests",
            reply_topic=reply_topic,
            dead_letter_topic="kbatch.requests.dlq",
        )
    RequestReplyClient(  # no dead-letter topic known: only the request topic is refused
        bootstrap="127.0.0.1:1", request_topic="other", reply_topic="kbatch.requests.dlq"
    )


def test_kbatch_request_refuses_the_dead_letter_topic_in_one_line() -> None:
    # Regression: --reply-topic kbatch.requests.dlq read the request's own dead
    # letter as its reply. No broker listens on port 1: the refusal comes first.
    runner = CliRunner()
    common = ["--bootstrap", "127.0.0.1:1", "--reply-topic"]
    default = runner.invoke(request_command, ["t", *common, "kbatch.requests.dlq"])
    assert default.exit_code == 2
    assert "'kbatch.requests.dlq' is the server's dead-letter topic" in default.output
    assert "Traceback" not in default.output
    env = runner.invoke(request_command, ["t", *common, "x.dlq"], env={"KBATCH_DLQ_TOPIC": "x.dlq"})
    assert env.exit_code == 2 and "dead-letter topic" in env.output


def test_a_timeout_names_the_allow_list_only_for_a_reply_topic_serve_may_refuse() -> None:
    """serve's own default reply topic is always allowed: pointing at --allowed-reply-topics
    there sent a user hunting for a refusal that could not have happened."""
    from producer_tools.client import RequestTimeoutError

    default = RequestTimeoutError(b"k", 5, 1, "kbatch.requests", "kbatch.replies")
    own = RequestTimeoutError(b"k", 5, 1, "kbatch.requests", "my.replies")
    assert "--allowed-reply-topics" not in str(default)
    assert "is a kbatch serve consuming that topic?" in str(default)
    assert "does it allow replies to 'my.replies' (--allowed-reply-topics" in str(own)


def test_a_refused_connection_is_not_reported_as_a_timeout() -> None:
    """No broker listens on port 1: the refusal comes at once, and the line says what happened
    instead of "within 30 s"."""
    result = CliRunner().invoke(request_command, ["t", "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 1
    assert "cannot start the client on 127.0.0.1:1" in result.output
    assert "Connect call failed" in result.output
    assert "within" not in result.output
    assert "Traceback" not in result.output


async def test_a_listener_that_never_speaks_kafka_is_named_as_such() -> None:
    """A port that accepts and never answers (another service, a black-holing proxy): the line
    says so instead of a bare TimeoutError()."""
    import socket

    from producer_tools.client import ClientError

    with socket.create_server(("127.0.0.1", 0)) as server:
        bootstrap = f"127.0.0.1:{server.getsockname()[1]}"
        client = RequestReplyClient(
            bootstrap=bootstrap, request_topic="q", reply_topic="r", start_timeout_s=1.0
        )
        with pytest.raises(ClientError) as info:
            await client.start()
    message = str(info.value)
    assert f"cannot start the client on {bootstrap}" in message
    assert "within 1 s: no answer on an open connection (is it a Kafka listener" in message
