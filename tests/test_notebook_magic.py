"""The %%needs_internet cell magic (vitlab.notebook): honest output where a download fails."""

from __future__ import annotations

import socket
import urllib.error
from collections.abc import Callable

import pytest
import torch

from vitlab.notebook import is_failed_download, run_needing_internet
from vitlab.pretrained import WeightsUnavailableError


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


@pytest.mark.parametrize(
    "cell",
    [
        "open('no/such/local/file.txt')",  # FileNotFoundError
        "import os\nos.listdir('no/such/local/folder')",
        "raise PermissionError('data is read-only')",
        "raise OSError('disk full')",
    ],
)
def test_a_local_file_error_is_that_error_not_a_failed_download(cell: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Bug 3: every OSError used to print "a download failed ... Run it in Colab" and skip
    the later cells of the model."""
    unavailable: set[str] = set()
    with pytest.raises(OSError) as error:
        run_needing_internet("vit_tiny_patch16_224", f"x = 1\n{cell}", {}, unavailable)
    assert not is_failed_download(error.value)
    assert unavailable == set()
    assert "Not run here" not in capsys.readouterr().out


def test_a_local_file_error_is_raised_even_where_the_internet_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    from vitlab.notebook import REQUIRE_ENV

    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(FileNotFoundError):
        run_needing_internet("vit_tiny_patch16_224", "open('no/such/local/file.txt')", {}, set())


def _transformers_style() -> OSError:
    """transformers raises a plain OSError *from* the hub's error."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        raise LocalEntryNotFoundError("not cached and the hub cannot be reached")
    except LocalEntryNotFoundError as cause:
        error = OSError("We couldn't connect to 'https://huggingface.co' to load the files")
        error.__cause__ = cause
        return error


@pytest.mark.parametrize(
    "make",
    [
        lambda: WeightsUnavailableError("could not download the released weights of 'cvt_13'"),
        lambda: urllib.error.URLError(socket.gaierror(-2, "Name or service not known")),  # a dataset download
        lambda: socket.gaierror(-2, "Name or service not known"),
        lambda: TimeoutError("timed out"),
        lambda: ConnectionResetError("reset by peer"),
        lambda: pytest.importorskip("huggingface_hub.errors").OfflineModeIsEnabled("HF_HUB_OFFLINE=1"),
        lambda: pytest.importorskip("huggingface_hub.errors").LocalEntryNotFoundError("not cached"),
        _transformers_style,
    ],
)
def test_failed_downloads_are_reported_as_one(
    make: Callable[[], BaseException], capsys: pytest.CaptureFixture[str]
) -> None:
    error = make()
    assert is_failed_download(error)
    unavailable: set[str] = set()
    assert not run_needing_internet("cvt_13", "raise error", {"error": error}, unavailable)
    assert unavailable == {"cvt_13"}
    assert f"a download failed ({type(error).__name__})" in capsys.readouterr().out
