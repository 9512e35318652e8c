"""mkdocs hooks of the documentation site (mkdocs.yml): README.md and BENCHMARKS.md, which live
at the repository's root, become the pages ``readme.md`` and ``benchmarks.md``, and the links
between them and docs/ are rewritten to the site's layout. On GitHub the files keep their
relative links as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
ROOT_PAGES = {"README.md": "readme.md", "BENCHMARKS.md": "benchmarks.md"}
"""Root file → its page in the site."""


def _root_links(markdown: str) -> str:
    """A root file's links as seen from docs/: ``docs/X`` → ``X``, a root page → its page."""
    markdown = re.sub(r"\]\(docs/", "](", markdown)
    for name, page in ROOT_PAGES.items():
        markdown = markdown.replace(f"]({name}", f"]({page}")
    return markdown


def on_files(files: Files, config: Any) -> Files:
    for name, page in ROOT_PAGES.items():
        text = _root_links((ROOT / name).read_text())
        files.append(File.generated(config, page, content=text))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """A docs page's links to a root file (``../BENCHMARKS.md`` from docs/, ``../../…`` from
    docs/reference/) → the root file's page."""
    depth = page.file.src_uri.count("/")
    for name, target in ROOT_PAGES.items():
        markdown = markdown.replace(f"]({'../' * (depth + 1)}{name}", f"]({'../' * depth}{target}")
    return markdown
