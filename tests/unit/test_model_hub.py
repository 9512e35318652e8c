"""``--model ORG/NAME[@REV]``: a hub id resolved through huggingface_hub's own cache layout
(a real ``models--ORG--NAME/snapshots/<commit>/`` + ``refs/`` tree of the packaged MiniLM),
offline; the messages when it is neither cached nor reachable."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from consumer.model.errors import ModelNotFoundError
from consumer.model.hub import parse_hub_id
from consumer.model.loader import check_model, packaged_model_dir, resolve_model
from consumer.model.settings import ModelSettings

REPO = "sentence-transformers/all-MiniLM-L6-v2"
MAIN = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"
TAGGED = "1" * 40


def _cache(root: Path) -> Path:
    """An HF hub cache under ``root`` holding the packaged MiniLM at two commits: ``MAIN``
    (refs/main) and ``TAGGED`` (refs/v1), files linked into blobs/ as the hub lays them out."""
    repo = root / "models--sentence-transformers--all-MiniLM-L6-v2"
    (repo / "blobs").mkdir(parents=True)
    for commit in (MAIN, TAGGED):
        for src in packaged_model_dir().rglob("*"):
            if src.is_file():
                content = src.read_bytes()
                blob = repo / "blobs" / hashlib.sha256(content).hexdigest()  # the hub's naming
                blob.write_bytes(content)
                link = repo / "snapshots" / commit / src.relative_to(packaged_model_dir())
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    (repo / "refs" / "v1").write_text(TAGGED)
    return root


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache above as huggingface_hub's, offline (HF_HUB_OFFLINE=1, read at import)."""
    root = _cache(tmp_path / "hub")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return root


@pytest.mark.parametrize(
    ("model", "revision", "expected"),
    [
        (REPO, None, (REPO, None)),
        (f"{REPO}@v1", None, (REPO, "v1")),
        (REPO, "v1", (REPO, "v1")),
        (f"{REPO}@{MAIN}", MAIN, (REPO, MAIN)),
        ("bert-base-uncased", None, ("bert-base-uncased", None)),  # a legacy id, no org
        ("./models/mine", None, None),  # a path, not an id
        ("/srv/models/mine", None, None),
        ("~/models", None, None),
        ("a/b/c", None, None),
    ],
)
def test_parse_hub_id(
    model: str, revision: str | None, expected: tuple[str, str | None] | None
) -> None:
    assert parse_hub_id(model, revision) == expected


def test_a_revision_pinned_twice_differently_is_refused() -> None:
    with pytest.raises(ValueError, match="pins revision v1, --model-revision says v2"):
        parse_hub_id(f"{REPO}@v1", "v2")


def test_a_cached_hub_id_resolves_offline_to_its_snapshot(hub_cache: Path) -> None:
    path, info = resolve_model(ModelSettings(model=REPO))
    assert path == hub_cache / "models--sentence-transformers--all-MiniLM-L6-v2/snapshots" / MAIN
    assert (info.name, info.revision) == (REPO, MAIN)  # replies report the commit
    assert check_model(ModelSettings(model=REPO)) == path  # task head, prompts: read from it


@pytest.mark.parametrize(
    "settings",
    [ModelSettings(model=f"{REPO}@v1"), ModelSettings(model=REPO, model_revision="v1"),
     ModelSettings(model=f"{REPO}@{TAGGED}")],
)  # fmt: skip
def test_a_revision_pin_picks_its_snapshot(hub_cache: Path, settings: ModelSettings) -> None:
    path, info = resolve_model(settings)
    assert path.name == TAGGED and info.revision == TAGGED


def test_an_id_neither_cached_nor_reachable_offline_says_what_to_do(hub_cache: Path) -> None:
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model(ModelSettings(model="intfloat/e5-small-v2"))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("--model intfloat/e5-small-v2: not in the Hugging Face cache (")
    assert "HF_HUB_OFFLINE=1" in message and "hf download intfloat/e5-small-v2" in message


def test_an_unknown_revision_of_a_cached_id_is_not_found_offline(hub_cache: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="not in the Hugging Face cache"):
        resolve_model(ModelSettings(model=f"{REPO}@v9"))


def test_a_cached_snapshot_without_weights_is_named(hub_cache: Path) -> None:
    snapshot = hub_cache / "models--sentence-transformers--all-MiniLM-L6-v2/snapshots" / MAIN
    (snapshot / "model.safetensors").unlink()
    with pytest.raises(ModelNotFoundError, match=r"holds no \*\.safetensors or pytorch_model"):
        resolve_model(ModelSettings(model=REPO))


def test_an_unreachable_hub_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model(ModelSettings(model="intfloat/e5-small-v2"))
    assert "the hub is unreachable" in str(err.value) and "hf download" in str(err.value)


def test_a_local_directory_wins_and_a_missing_path_is_not_looked_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "org" / "name"
    local.mkdir(parents=True)
    (local / "config.json").write_text(json.dumps({"model_type": "bert"}))
    path, info = resolve_model(ModelSettings(model="org/name", model_revision="mine"))
    assert path == Path("org/name") and (info.name, info.revision) == ("name", "mine")
    with pytest.raises(ModelNotFoundError, match=r"--model \./nope: no config\.json in nope"):
        resolve_model(ModelSettings(model="./nope"))


def test_serve_resolves_a_hub_id_with_hf_home_and_offline_in_its_environment(
    tmp_path: Path,
) -> None:
    """The environment a user sets (read by huggingface_hub at import), in a fresh process."""
    _cache(tmp_path / "home" / "hub")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "home")}
    env.pop("HF_HUB_CACHE", None)
    code = (
        "from consumer.model.loader import check_model, resolve_model\n"
        "from consumer.model.settings import ModelSettings\n"
        f"s = ModelSettings(model={REPO!r})\n"
        "print(check_model(s).name, resolve_model(s)[1].revision)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [MAIN, MAIN]
