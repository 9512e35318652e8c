"""``--plots-dir`` / ``--log-dir`` (:class:`consumer.cli.options.OutputDir`): a folder that
cannot be written is refused when the flag is read, in one line, not with a traceback after
the run (``kbatch load --plots-dir /proc/nope``)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from consumer.cli import cli


def test_an_unwritable_plots_dir_is_one_usage_error_before_the_run() -> None:
    out = CliRunner().invoke(cli, ["load", "--count", "1", "--plots-dir", "/proc/nope"])
    assert out.exit_code == 2
    assert "Invalid value for '--plots-dir': cannot write to '/proc/nope'" in out.output
    assert "Traceback" not in out.output


def test_a_plots_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("")
    out = CliRunner().invoke(cli, ["bench", "e2e", "--plots-dir", str(a_file)])
    assert out.exit_code == 2 and "'--plots-dir'" in out.output


def test_a_missing_folder_is_made_with_its_parents_and_left_empty(tmp_path: Path) -> None:
    from consumer.cli.options import OutputDir

    folder = OutputDir().convert(str(tmp_path / "a" / "b"), None, None)
    assert folder == tmp_path / "a" / "b" and folder.is_dir()
    assert list(folder.iterdir()) == []  # the write probe leaves nothing behind
