"""The documentation site builds strict (``make docs``): every page in the nav, every link and
anchor found. mkdocs.yml's ``validation`` turns a broken link, a missing anchor or a page left
out of the nav into a warning, and ``strict`` turns a warning into a failed build."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``config`` into ``site``; never ``-q``: it hides the warnings
    that strict counts, and the build passes whatever they say."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_the_site_builds_strict(tmp_path: Path) -> None:
    out = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert out.returncode == 0, out.stdout + out.stderr
    for page in (
        "index.html",
        "readme/index.html",
        "benchmarks/index.html",
        "reference/cli/index.html",
    ):
        assert (tmp_path / "site" / page).is_file(), page


def test_a_broken_link_or_an_unlisted_page_fails_the_build(tmp_path: Path) -> None:
    """The same configuration on a copy of docs/ with one page outside the nav and one broken
    link: the strict build fails and names both."""
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", str(ROOT / "docs"), str(docs)], check=True)
    (docs / "stray.md").write_text("# Stray\n\n[gone](no-such-page.md)\n")
    config = tmp_path / "mkdocs.yml"
    text = (
        (ROOT / "mkdocs.yml")
        .read_text()
        .replace("scripts/mkdocs_hooks.py", str(ROOT / "scripts" / "mkdocs_hooks.py"))
    )
    config.write_text(text)
    out = _build(config, tmp_path / "site")
    assert out.returncode != 0
    assert "stray.md" in out.stderr and "no-such-page.md" in out.stderr, out.stderr
