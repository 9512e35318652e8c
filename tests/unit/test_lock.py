"""Reproducible installs: ``make setup`` installs exactly ``requirements.lock``.

The lock is written by ``uv pip compile`` (``make lock``) from ``pyproject.toml``; ``make
setup`` installs it with pip, then the project with ``--no-deps``. Run after a fresh ``make
setup`` (as CI does), these tests show that every locked distribution that applies to this
platform is installed at exactly its locked version, and that the lock still covers
``pyproject.toml`` (a dependency added there without ``make lock`` fails here).
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"


def _locked() -> dict[str, Requirement]:
    """Each pinned line of the lock (``name==version ; marker``), by canonical name."""
    pins: dict[str, Requirement] = {}
    for line in LOCK.read_text().splitlines():
        if not line or line[0] in "# " or line.startswith("-"):
            continue
        req = Requirement(line)
        assert len(req.specifier) == 1 and next(iter(req.specifier)).operator == "==", line
        pins[canonicalize_name(req.name)] = req
    return pins


def _pin(req: Requirement) -> str:
    return next(iter(req.specifier)).version


def test_every_locked_distribution_is_installed_at_its_locked_version() -> None:
    wrong = {}
    for name, req in _locked().items():
        if req.marker is not None and not req.marker.evaluate():
            continue  # another platform's dependency (e.g. colorama on Windows)
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != _pin(req):
            wrong[name] = (_pin(req), installed)
    assert not wrong, f"locked vs installed (run `make setup`): {wrong}"


def test_the_lock_covers_pyproject_within_its_bounds() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    direct = [*project["dependencies"], *extras["serve"], *extras["otel"], *extras["dev"]]
    locked = _locked()
    for spec in direct:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} is not in the lock: run `make lock`"
        assert req.specifier.contains(_pin(locked[name]), prereleases=True), (
            f"{req.name}: locked {_pin(locked[name])} is outside {req.specifier}: run `make lock`"
        )


def test_make_setup_installs_the_lock_then_the_project_without_dependencies() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("$(VENV)/.installed:", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"pip install .*-r \$\(LOCK\)", recipe)
    assert re.search(r"pip install .*--no-deps -e \.", recipe)
    assert "LOCK := requirements.lock" in makefile
    assert "uv pip compile" in makefile.split("\nlock:", 1)[1]
    assert "--extra serve --extra dev" in makefile.split("\nlock:", 1)[1]  # serve's too
