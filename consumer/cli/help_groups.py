"""The option groups of ``--help``: each option's concern, as data.

``kbatch serve --help`` has ~80 options; they are shown in panels by concern (rich-click's
option panels), in :data:`GROUP_ORDER`. :data:`OPTION_GROUP` maps an option's name (its click
parameter name: the settings field, ``max_batch_size``) to its group, :data:`COMMAND_GROUP`
a command's own exceptions; :func:`groups_of` gives a command's panels from both.
An option not in the mapping goes to :data:`OTHER`: a command whose options are all there keeps
rich-click's one panel; a test keeps :data:`OTHER` out of the commands that have panels.
"""

from __future__ import annotations

from collections.abc import Mapping

import click
from rich_click import RichCommand, RichOptionPanel

__all__ = [
    "COMMAND_GROUP",
    "GROUP_ORDER",
    "OPTION_GROUP",
    "OTHER",
    "apply_option_panels",
    "groups_of",
]

KAFKA = "Kafka"
TOPICS = "Topics"
RANGE = "Range"
INPUT = "Input"
REQUEST = "Request options"
BENCH = "Benchmark"
DEMO = "Demo"
MODEL = "Model"
BATCHING = "Batching"
LANES = "Lanes"
FLOW = "Flow control"
DELIVERY = "Delivery"
PROCESS = "Process"
SECURITY = "Security"
JOBS = "Backfill jobs"
OBSERVABILITY = "Observability"
LOAD = "Load"
OUTPUT = "Output"
CONFIGURATION = "Configuration"
OTHER = "Options"

GROUP_ORDER: tuple[str, ...] = (
    KAFKA,
    TOPICS,
    RANGE,
    INPUT,
    REQUEST,
    LOAD,
    BENCH,
    DEMO,
    MODEL,
    BATCHING,
    LANES,
    FLOW,
    DELIVERY,
    SECURITY,
    JOBS,
    PROCESS,
    OBSERVABILITY,
    OUTPUT,
    CONFIGURATION,
    OTHER,
)
"""The panels, top first."""


def _each(group: str, names: str) -> dict[str, str]:
    return dict.fromkeys(names.split(), group)


OPTION_GROUP: Mapping[str, str] = {
    **_each(
        KAFKA,
        """bootstrap kafka_client group_id group_instance_id group_protocol
        leave_group_on_shutdown auto_offset_reset
        session_timeout_ms heartbeat_interval_ms max_poll_interval_ms rebalance_timeout_ms
        poll_max_records poll_timeout_ms""",
    ),
    **_each(
        TOPICS,
        """request_topic reply_topic dlq_topic allowed_reply_topics create_topics
        topic_partitions topic_replication_factor partitions replication_factor source_topic
        output_topic""",
    ),
    **_each(RANGE, "range_from range_to"),
    **_each(INPUT, "text_field documents_field value_format"),
    **_each(
        REQUEST,
        """text_file key documents meta priority retries full dimensions normalize prompt_name
        encoding_format top_n top_k aggregation redact chunk_max_tokens chunk_overlap
        chunk_output""",
    ),
    **_each(
        MODEL,
        """model model_name model_dir model_revision task device dtype torch_threads
        cpu_budget backend torch_trace quantize allow_lossy max_length truncate window_stride
        max_windows max_text_bytes default_prompt_name""",
    ),
    **_each(
        BATCHING,
        """max_batch_size max_batch_tokens max_wait_ms bucket_edges preferred_batch_sizes
        adaptive_wait batch_overhead_tokens target_p99_ms rate_window_ms batch_timeout_s""",
    ),
    **_each(LANES, "bulk_max_batch_ms bulk_min_share lane_share_window_ms"),
    **_each(
        FLOW,
        """max_partition_records max_partition_tokens max_total_records max_total_tokens
        resume_fraction bulk_total_fraction max_in_flight_records max_concurrent_sends""",
    ),
    **_each(
        DELIVERY,
        """send_timeout_ms commit_interval_ms exactly_once drain_timeout_s dedup_ttl_s
        dedup_max_entries""",
    ),
    **_each(
        SECURITY,
        """security_protocol sasl_mechanism sasl_username sasl_password_file
        sasl_oauth_token_file ssl_cafile ssl_certfile ssl_keyfile ssl_check_hostname""",
    ),
    **_each(JOBS, "jobs_topic jobs_topic_replication_factor run_jobs"),
    **_each(PROCESS, "replicas"),
    **_each(KAFKA, "broker_port"),
    **_each(OBSERVABILITY, "metrics_port metrics_host log_level tracing progress traceparent"),
    **_each(
        LOAD,
        """pattern rate_per_s duration_s count corpus warmup_s rates_per_s steps step_s burst_factor
        burst_s burst_every_s first_burst_s after_s poisson_arrivals timeout_s
        deadline_after_ms encoding metrics_url max_error_rate no_probe knee_p99_factor
        knee_p99_ms""",
    ),
    **_each(
        BENCH,
        """texts_file n seconds rate rate_fraction fixed_batch_size rounds strategies
        latency_s latency_warmup_s load_fraction latency_fractions latency_rates fractions
        max_latency_rate variants serve_prefix batch_size no_sentence_transformers dims
        windows stride repeats seed""",
    ),
    **_each(DEMO, "steady_s steady_rate pulse_s"),
    **_each(OUTPUT, "as_json plots_dir plots_prefix no_progress no_plots log_dir"),
    **_each(CONFIGURATION, "config"),
}
"""Option name (click parameter name) → its group in ``--help``."""

COMMAND_GROUP: Mapping[str, Mapping[str, str]] = {
    "request": {
        **_each(DELIVERY, "timeout_s deadline_after_ms encoding"),
        **_each(REQUEST, "task truncate"),
        "full": OUTPUT,
    },
    "load": {"seed": LOAD},
    "e2e": {"replicas": BENCH},
}
"""Command name → the groups of its options where :data:`OPTION_GROUP`'s do not fit it
(``kbatch request``'s ``--task`` is a request option, serve's a model setting)."""


_RANK = {name: i for i, name in enumerate(OPTION_GROUP)}


def groups_of(command: click.Command) -> dict[str, list[click.Option]]:
    """``command``'s options by group, in :data:`GROUP_ORDER` (empty groups left out), each
    group's options in :data:`OPTION_GROUP`'s order (the others after them, as declared)."""
    found: dict[str, list[click.Option]] = {}
    own = COMMAND_GROUP.get(command.name or "", {})
    for param in command.params:
        if isinstance(param, click.Option):
            name = param.name or ""
            found.setdefault(own.get(name) or OPTION_GROUP.get(name, OTHER), []).append(param)
    return {
        group: sorted(found[group], key=lambda o: _RANK.get(o.name or "", len(_RANK)))
        for group in GROUP_ORDER
        if group in found
    }


def apply_option_panels(command: click.Command) -> None:
    """Show the options of ``command`` and of its subcommands in :func:`groups_of` panels
    (a command with fewer than two groups keeps rich-click's single panel)."""
    if isinstance(command, RichCommand):
        groups = groups_of(command)
        if len(groups) > 1:
            names = [[o.name for o in options if o.name] for options in groups.values()]
            names[-1].append("help")  # --help in the last panel, not in one of its own
            command.panels = [
                RichOptionPanel(name=group, options=options)
                for group, options in zip(groups, names, strict=True)
            ]
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            apply_option_panels(sub)
