"""The %%needs_internet cell magic (vitlab.notebook): honest output where a download fails."""

from __future__ import annotations

import pytest
import torch

from vitlab.notebook import run_needing_internet


def test_runs_the_cell_when_nothing_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict = {}
    assert run_needing_internet("vit_tiny_patch16_224", "x = 1 + 1\nprint('ran', x)", namespace, set())
    assert namespace["x"] == 2
    assert capsys.readouterr().out == "ran 2\n"


def test_a_failed_download_prints_one_line_and_skips_later_cells_of_the_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    unavailable: set[str] = set()
    failing = "raise ConnectionRefusedError('no network')"
    assert not run_needing_internet("cvt_13", failing, {}, unavailable)
    assert unavailable == {"cvt_13"}
    first = capsys.readouterr().out
    assert first.count("\n") == 1 and "ConnectionRefusedError" in first and "Colab" in first

    namespace: dict = {}
    assert not run_needing_internet("cvt_13", "y = 1", namespace, unavailable)
    assert "y" not in namespace
    assert "earlier cell could not download" in capsys.readouterr().out
    assert run_needing_internet("pit_s_224", "y = 1", namespace, unavailable), "another model still runs"


def test_other_errors_are_raised() -> None:
    with pytest.raises(ZeroDivisionError):
        run_needing_internet("vit_tiny_patch16_224", "1 / 0", {}, set())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_gpu_cells_are_skipped_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict = {}
    assert not run_needing_internet("deit_tiny_patch16_224 --gpu", "z = 1", namespace, set())
    assert "z" not in namespace and "CUDA GPU" in capsys.readouterr().out


def test_the_magic_needs_a_model_name() -> None:
    with pytest.raises(SystemExit):
        run_needing_internet("", "pass", {}, set())


def test_where_the_internet_is_required_a_failed_download_names_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from vitlab.notebook import REQUIRE_ENV, DownloadFailedError

    monkeypatch.setenv(REQUIRE_ENV, "1")
    unavailable: set[str] = set()
    with pytest.raises(DownloadFailedError, match="levit_128s.*ConnectionRefusedError"):
        run_needing_internet("levit_128s", "raise ConnectionRefusedError('no network')", {}, unavailable)
    assert unavailable == set(), "nothing is skipped quietly: the run stops"
    with pytest.raises(ZeroDivisionError):
        run_needing_internet("levit_128s", "1 / 0", {}, unavailable)
