"""The start-up check of a model directory's files: each problem is one line naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumer.model.limits import check_model_files


def _model_dir(
    tmp_path: Path, config: str = "{}", weights: str | None = "model.safetensors"
) -> Path:
    (tmp_path / "config.json").write_text(config)
    if weights is not None:
        (tmp_path / weights).write_bytes(b"\0")
    return tmp_path


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin",
                                     "model-00001-of-00002.safetensors",
                                     "pytorch_model-00001-of-00002.bin"])  # fmt: skip
def test_a_directory_with_json_and_weights_passes(tmp_path: Path, weights: str) -> None:
    check_model_files(_model_dir(tmp_path, weights=weights))


def test_a_config_that_is_not_json_names_the_file(tmp_path: Path) -> None:
    """Before, transformers' or json's own message came without the file's name."""
    model = _model_dir(tmp_path, config="{broken")
    with pytest.raises(ValueError, match=r"config\.json: not valid JSON \(Expecting property"):
        check_model_files(model)


def test_any_top_level_json_file_is_checked(tmp_path: Path) -> None:
    model = _model_dir(tmp_path)
    (model / "tokenizer_config.json").write_text('{"model_max_length": ')
    with pytest.raises(ValueError, match=r"tokenizer_config\.json: not valid JSON"):
        check_model_files(model)


def test_no_weights_says_what_is_missing(tmp_path: Path) -> None:
    """Before, the start-up check said 'cannot tell the model's maximum length', or the load
    failed with transformers' traceback after the broker was contacted."""
    model = _model_dir(tmp_path, weights=None)
    with pytest.raises(ValueError, match=r"no model weights \(model\.safetensors or pytorch"):
        check_model_files(model)
