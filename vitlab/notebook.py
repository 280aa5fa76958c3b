"""The ``%%needs_internet`` cell magic of the chapters' "With trained weights" sections.

A chapter loads it once (``%load_ext vitlab.notebook``, in its hidden setup cell) and
starts each cell that downloads something with it::

    %%needs_internet vit_base_patch16_224
    trained = vitlab.create_model("vit_base_patch16_224", pretrained=True)
    ...

Online (Colab), the cell runs as written. Where a download fails (no network and no
cached copy), the cell prints one line saying so instead of a traceback, and later cells
of the same notebook that name the same model are skipped, since they use what the failed
cell would have made. ``--gpu`` also skips the cell where CUDA is missing (a fine-tuning
run that would take hours on a CPU). So every chapter runs top to bottom on any machine,
and what an offline run stores is a true account of what happened, never a stand-in
result. Only a failed download counts as one (:func:`is_failed_download`); any other
error, a missing local file included, is raised as usual.

The published book must show the real outputs, never the "Not run here" line: where the
environment variable ``VITLAB_REQUIRE_INTERNET`` is ``1`` (``make book-online`` sets it
for the kernels it starts), a failed download raises :class:`DownloadFailedError`, which
names the model, and the notebook's run stops there.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
import urllib.error
from typing import Any

import torch

from vitlab.pretrained import WeightsUnavailableError

# What a failed download raises, besides the network errors of the standard library: the
# hub's "not cached, and the hub cannot be reached" and the HTTP clients' errors. Looked up
# only in modules already imported: an error cannot come from a module nobody imported.
_CLIENT_ERRORS = {
    "huggingface_hub.errors": ("LocalEntryNotFoundError", "HfHubHTTPError"),
    "httpx": ("HTTPError",),
    "httpx2": ("HTTPError",),
    "requests": ("ConnectionError", "Timeout", "HTTPError"),
}
REQUIRE_ENV = "VITLAB_REQUIRE_INTERNET"  # "1": a failed download is an error (make book-online)


class DownloadFailedError(RuntimeError):
    """A ``%%needs_internet`` cell's download failed where the internet is required."""


def is_failed_download(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, says that a download failed.

    Network errors (``ConnectionError``, ``TimeoutError``, ``socket.gaierror``,
    ``urllib.error.URLError`` of a dataset download), vitlab's
    :class:`~vitlab.pretrained.WeightsUnavailableError`, the hub's and the HTTP clients'
    errors; transformers raises an OSError *from* the hub's. Never a plain OSError such as
    a missing local file.
    """
    kinds: list[type[BaseException]] = [WeightsUnavailableError, ConnectionError, TimeoutError, socket.gaierror]
    kinds.append(urllib.error.URLError)  # includes HTTPError
    for module, names in _CLIENT_ERRORS.items():
        if module in sys.modules:
            kinds.extend(getattr(sys.modules[module], name) for name in names)
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, tuple(kinds)):
            return True
        cause = cause.__cause__
    return False


def _parse(line: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="%%needs_internet", add_help=False)
    parser.add_argument("name", help="the model whose released weights the cell downloads")
    parser.add_argument("--gpu", action="store_true", help="also skip the cell where CUDA is missing")
    return parser.parse_args(shlex.split(line))


def run_needing_internet(line: str, cell: str, namespace: dict[str, Any], unavailable: set[str]) -> bool:
    """Run ``cell`` in ``namespace`` unless what it needs is missing; True when it ran to the end.

    ``unavailable`` collects the names whose download failed, so that later cells naming
    them are skipped; the magic keeps one such set per IPython session.
    """
    args = _parse(line)
    if args.name in unavailable:
        print(f"Not run here: it needs the {args.name} weights that an earlier cell could not download.")
        return False
    if args.gpu and not torch.cuda.is_available():
        print("Not run here: it needs a CUDA GPU (in Colab: Runtime > Change runtime type > GPU).")
        return False
    try:
        exec(compile(cell, f"<needs_internet {args.name}>", "exec"), namespace)  # noqa: S102 (the cell's own code)
    except Exception as error:
        if not is_failed_download(error):
            raise
        if os.environ.get(REQUIRE_ENV) == "1":
            message = f"the download for {args.name} failed ({type(error).__name__}: {error}), and {REQUIRE_ENV}=1"
            raise DownloadFailedError(message) from error
        unavailable.add(args.name)
        kind = type(error).__name__
        print(f"Not run here: a download failed ({kind}); this cell needs the internet. Run it in Colab.")
        return False
    return True


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext vitlab.notebook``: registers ``%%needs_internet``."""
    unavailable: set[str] = set()

    def needs_internet(line: str, cell: str) -> None:
        run_needing_internet(line, cell, ipython.user_ns, unavailable)

    ipython.register_magic_function(needs_internet, magic_kind="cell", magic_name="needs_internet")
