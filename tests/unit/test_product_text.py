"""The product speaks of itself: no line of its docs, help texts, comments or script names
cites a ticket, a trial or a work sitting. A reader has none of those; a line says what a thing
is and why, and a figure carries its date, commit, machine and command (BENCHMARKS.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PRODUCT = [
    "consumer", "producer_tools", "schemas", "tests", "docs", "scripts", "deploy", ".ci",
    "README.md", "BENCHMARKS.md", "pyproject.toml", "Makefile", "Dockerfile",
    "docker-compose.yml", "mkdocs.yml",
]  # fmt: skip
SUFFIXES = {".py", ".md", ".sh", ".yml", ".yaml", ".toml", ".json", ".txt", ".cfg", ""}

WORK_NOTES = re.compile(
    r"\bissues?[- ]?#?\d"  # issue 26, issue-26, issues 12
    r"|(?<![\w&])#\d{1,5}\b"  # #36 (not a colour such as #1f77b4, not PKCS#8)
    r"|\b(?:new-user|fresh-user|user|a|the|this) trials?\b|\btrial's\b"
    r"|\bbecame 0\b|\b(?:the|this|that) issue\b"
    r"|\b(?:this|that|next|last|previous|earlier|later|other|each|every|same|first|second"
    r"|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th)) sessions?\b"
    r"|\bthe lead\b|\bhelper agents?\b|\bsubagents?\b",
    re.I,
)
"""What a work note looks like: a ticket number, a trial, a work sitting, a person."""


def _product_files() -> list[Path]:
    out = []
    for name in PRODUCT:
        path = ROOT / name
        files = sorted(path.rglob("*")) if path.is_dir() else [path] if path.exists() else []
        out += [f for f in files if f.is_file() and f.suffix in SUFFIXES and f != Path(__file__)]
    return out


def work_notes(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of each line of ``text`` that reads as a work note."""
    return [(n, line) for n, line in enumerate(text.splitlines(), 1) if WORK_NOTES.search(line)]


def test_no_line_of_the_product_is_a_work_note() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}"
        for path in _product_files()
        for n, line in work_notes(path.read_text(errors="replace"))
    ]
    assert not found, "say what a thing is and why, not which ticket or trial brought it:\n" + (
        "\n".join(found)
    )


def test_no_script_is_named_after_a_ticket() -> None:
    names = [p.name for p in (ROOT / "scripts").iterdir()]
    assert not [n for n in names if re.search(r"issue|ticket|trial", n, re.I)], names


def test_the_pattern_finds_the_usual_work_notes() -> None:
    for note in (
        "Lanes (issue 26): a bulk batch",
        "see issue-36",
        "fixed in #36",
        "found by a new-user trial",
        "the fourth " + "session's quiet figure",  # split: the text itself is no work note
        "273 ERROR lines became 0",
        "the issue asks for 0.92",
    ):
        assert work_notes(note), note
    for fine in (
        "the session timeout",
        "colour #1f77b4",
        "PKCS#8 keys",
        "a session fixture",
    ):
        assert not work_notes(fine), fine
