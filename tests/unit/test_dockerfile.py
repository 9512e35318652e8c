"""The image installs what ``make setup`` installs: every dependency at the version
``requirements.lock`` pins, then kbatch itself without dependencies. No Docker engine here: the
Dockerfile is read, and its dependency-listing step run against this checkout."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.unit.test_deploy_manifests import ROOT
from tests.unit.test_lock import _locked

DOCKERFILE = ROOT / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _pip_installs() -> list[tuple[int, str]]:
    return [
        (i, cmd)
        for i, (kind, args) in enumerate(_instructions())
        if kind == "RUN"
        for cmd in args.split("&&")
        if "pip install" in cmd
    ]


def test_dependencies_are_installed_at_the_locked_versions_then_kbatch_without_deps() -> None:
    steps = _instructions()
    installs = _pip_installs()
    assert len(installs) == 2, installs
    (deps_at, deps), (own_at, own) = installs
    copied = [
        i for i, (kind, args) in enumerate(steps) if kind == "COPY" and "requirements.lock" in args
    ]
    assert copied and copied[0] < deps_at  # the lock is in the image before it is used
    assert "-c requirements.lock" in deps or "-r requirements.lock" in deps, deps
    assert own.split()[-2:] == ["--no-deps", "."], own
    sources = [i for i, (kind, args) in enumerate(steps) if kind == "COPY" and "consumer" in args]
    assert deps_at < sources[0] < own_at  # a code change does not reinstall torch


def test_the_listed_dependencies_are_the_clients_serve_and_otel_each_locked() -> None:
    (_, args), *_ = [(k, a) for k, a in _instructions() if k == "RUN" and "tomllib" in a]
    code = shlex.split(args.split(">", 1)[0])[-1]  # python -c "<code>" > /tmp/requirements.txt
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    listed = out.stdout.split("\n")[:-1]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert listed == project["dependencies"] + extras["serve"] + extras["otel"]
    locked = _locked()
    for spec in listed:
        req = Requirement(spec.split("#")[0])
        assert canonicalize_name(req.name) in locked, f"{req.name} is not in requirements.lock"
