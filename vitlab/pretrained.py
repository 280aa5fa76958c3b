"""Released weights: ``vitlab.create_model(name, pretrained=True)``, a photo in, class names out.

The weights come from the hub of each model's reference implementation, never from a
downloader of our own: timm's default pretrained tag for the timm-named models (timm's
pretrained config names the Hugging Face repository, ``timm/<model>.<tag>``), and the
Hugging Face repository of ``transformers``' CvT. Both go through ``huggingface_hub``,
which caches (``HF_HOME``, ``HF_HUB_CACHE``), resumes downloads and honours
``HF_HUB_OFFLINE=1``. The reference model is built with its weights, its state dict is
converted by :func:`vitlab.convert_state_dict` and loaded strictly.

Preprocessing and class names also come from the ecosystem: timm's data config
(``resolve_data_config``, ``create_transform``) and timm's ImageNet class names, which
ship inside the timm package (no download).

This module sits above :mod:`vitlab.registry` (which it reads) and below
:mod:`vitlab.factory` (whose ``create_model`` calls :func:`load_released`); it imports
neither the factory nor ``vitlab`` itself, so the import graph has no cycle. timm,
huggingface_hub and (for CvT) transformers are the ``vitlab[pretrained]`` extra, imported
only when used; without them a clear ModuleNotFoundError names the install command.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import torch
from torch import Tensor, nn

from vitlab.registry import _module_for, convert_state_dict, get_config, list_models, model_class

# HuggingFace hub repositories of the models whose reference is HF ``transformers``.
HF_REPO_IDS: dict[str, str] = {
    "cvt_13": "microsoft/cvt-13",
    "cvt_21": "microsoft/cvt-21",
    "cvt_w24_384": "microsoft/cvt-w24-384-22k",
}

# Families whose official weights neither timm nor the Hugging Face hub carries: where the
# authors publish them (checked in each repository's README).
UNRELEASED: dict[str, str] = {
    "deepvit": "the README of github.com/zhoudaquan/dvit_repo (section 2, 'DeepViT Models') links them on Google Drive",
    "t2t_vit": "the GitHub releases of github.com/yitu-opensource/T2T-ViT (README section 2, 'T2T-ViT Models')",
}


# The packages of pyproject.toml's [pretrained] extra, and how to install them: the same
# git address as the Colab setup cell of every chapter, or the extra of a local clone.
INSTALL_COMMAND = (
    'pip install "vitlab[pretrained] @ git+https://github.com/vitlab-course/vit-lab@main" '
    '(in a clone of the repository: pip install -e ".[pretrained]")'
)


class WeightsUnavailableError(OSError):
    """The released weights could not be downloaded and are not in the Hugging Face cache."""


def _require(*packages: str) -> None:
    """Import ``packages``, or raise a ModuleNotFoundError that names the install command."""
    for package in packages:
        try:
            importlib.import_module(package)
        except ImportError as error:
            raise ModuleNotFoundError(
                f"released weights (create_model(..., pretrained=True)), their preprocessing and ImageNet labels "
                f"need the {package} package, which is not installed. It comes with vitlab's [pretrained] extra: "
                f"{INSTALL_COMMAND}",
                name=package,
            ) from error


def _family(name: str) -> str:
    return _module_for(name).__name__.rsplit(".", 1)[-1]


def pretrained_sources() -> dict[str, tuple[str, str]]:
    """Model name -> ``(source, weights id)`` for every model with released weights.

    ``("timm", "vit_tiny_patch16_224.augreg_in21k_ft_in1k")``: timm's default pretrained
    tag of the model of the same name (read from timm's registry, offline).
    ``("hf", "microsoft/cvt-13")``: the Hugging Face repository of ``transformers``' CvT.
    """
    _require("timm", "huggingface_hub")  # checked on every call: the table below is cached
    return dict(_sources())


@cache
def _sources() -> dict[str, tuple[str, str]]:
    import timm
    from timm.models import get_pretrained_cfg

    sources: dict[str, tuple[str, str]] = {}
    for name in list_models():
        module = _module_for(name)
        if hasattr(module, "convert_timm") and timm.is_model(name):
            cfg = get_pretrained_cfg(name)  # the default tag: timm's first, best weights
            if cfg is not None and cfg.hf_hub_id:
                sources[name] = ("timm", f"{name}.{cfg.tag}")
        elif hasattr(module, "convert_hf") and name in HF_REPO_IDS:
            sources[name] = ("hf", HF_REPO_IDS[name])
    return sources


def has_pretrained(name: str) -> bool:
    """Whether ``create_model(name, pretrained=True)`` has released weights to load."""
    _module_for(name)  # a KeyError with close names for an unknown model
    return name in pretrained_sources()


def pretrained_source(name: str) -> tuple[str, str]:
    """``(source, weights id)`` of ``name``'s released weights, or a ValueError saying why none."""
    sources = pretrained_sources()
    if name in sources:
        return sources[name]
    family = _family(name)
    if family in UNRELEASED:
        raise ValueError(
            f"{name!r} has no released weights in timm or on the Hugging Face hub, so pretrained=True cannot "
            f"load any. The authors publish theirs outside both: {UNRELEASED[family]}. vitlab has no converter "
            f"for those checkpoints; create_model({name!r}) gives a randomly initialised model."
        )
    similar = [other for other in sources if _family(other) == family]
    raise ValueError(
        f"{name!r} has no released weights in timm or on the Hugging Face hub (timm's registry has no "
        f"pretrained tag for it). Models of the same family that have some: {similar or 'none'}"
    )


def _download_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "the file could not be fetched": OSError covers huggingface_hub's
    (LocalEntryNotFoundError, HfHubHTTPError, OfflineModeIsEnabled) and transformers'; the
    HTTP clients' own errors are added when they are installed."""
    errors: list[type[BaseException]] = [OSError]
    for module, name in (("httpx", "HTTPError"), ("requests", "RequestException")):
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except ImportError:
            pass
    return tuple(errors)


def _timm_cfg(weights_id: str) -> Any:
    """timm's pretrained config of ``weights_id`` (``model.tag``)."""
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(weights_id)
    if cfg is None:
        raise RuntimeError(f"timm has no pretrained config {weights_id!r}")
    return cfg


def _hub_cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _unavailable(
    name: str, source: str, weights_id: str, repo_id: str, error: BaseException
) -> WeightsUnavailableError:
    offline = " (offline: HF_HUB_OFFLINE is set or the hub cannot be reached)" if _offline() else ""
    return WeightsUnavailableError(
        f"could not download the released weights of {name!r}{offline}: {source} weights {weights_id!r} "
        f"from the Hugging Face repository {repo_id!r}, and no copy is in the Hugging Face cache "
        f"({_hub_cache()}). Connect to the internet (Colab is online) and try again, or put a copy of "
        f"that repository in the cache: run huggingface_hub.snapshot_download({repo_id!r}) on a machine "
        f"that is online and copy its HF_HOME folder here (or point HF_HOME / HF_HUB_CACHE at a copy). "
        f"Cause: {type(error).__name__}: {error}"
    )


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub opens within ``timeout`` s (always True behind a proxy,
    which only the HTTP client knows how to use)."""
    from huggingface_hub import constants

    if any(os.environ.get(var) for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    host = urlsplit(constants.ENDPOINT).hostname or ""
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


@contextmanager
def _cache_only_when_unreachable() -> Iterator[None]:
    """Offline mode (``HF_HUB_OFFLINE``) while the hub cannot be reached.

    Without it, huggingface_hub retries each file five times with back-off (about half a
    minute per file) before it looks in the cache; with it, a cached copy loads and a
    missing one fails at once. The setting is restored on exit.
    """
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or _hub_reachable():
        yield
        return
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = False


def _reference_state_dict(name: str, source: str, weights_id: str) -> dict[str, Tensor]:
    """The reference model's state dict with its released weights (downloaded once, then cached).

    The file is fetched before any model is built, so a missing file fails in seconds.
    """
    if source == "timm":
        import timm
        from timm.models import load_state_dict_from_hf

        cfg = _timm_cfg(weights_id)
        location = (cfg.hf_hub_id, cfg.hf_hub_filename) if cfg.hf_hub_filename else (cfg.hf_hub_id,)
        with _cache_only_when_unreachable():
            try:
                checkpoint = load_state_dict_from_hf(*location)  # timm's hub helper: safetensors first
            except _download_errors() as error:
                raise _unavailable(name, source, weights_id, cfg.hf_hub_id, error) from error
        # timm applies its own checkpoint filter and loads strictly, as with pretrained=True;
        # source=None makes timm take this state dict instead of reading the hub again.
        overlay = {"state_dict": checkpoint, "source": None}
        return timm.create_model(weights_id, pretrained=True, pretrained_cfg_overlay=overlay).state_dict()

    _require("transformers")  # CvT's reference
    from transformers import CvtForImageClassification

    with _cache_only_when_unreachable():
        try:
            reference = CvtForImageClassification.from_pretrained(weights_id)
        except _download_errors() as error:
            raise _unavailable(name, source, weights_id, weights_id, error) from error
    return reference.state_dict()


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _head_keys(name: str, overrides: dict[str, Any]) -> set[str]:
    """Keys whose tensors change when ``num_classes`` is overridden: the classifier head(s).

    Found by building the model twice on the meta device (shapes only, no memory).
    """
    default = get_config(name)
    if overrides.get("num_classes", default.num_classes) == default.num_classes:
        return set()
    build = model_class(name)
    with torch.device("meta"):
        before = build(default).state_dict()
        after = build(get_config(name, num_classes=overrides["num_classes"])).state_dict()
    changed = {key for key in before.keys() & after.keys() if before[key].shape != after[key].shape}
    return changed | (before.keys() ^ after.keys())


def load_released(name: str, **overrides: Any) -> nn.Module:
    """``vitlab.create_model(name, pretrained=True, **overrides)``, the one public way to
    released weights: see the module docstring.

    ``num_classes`` may differ from the released head: the backbone is loaded and the head
    is freshly initialised (fine-tuning), as timm does. Any other override must keep every
    weight's shape (``drop_path_rate``, ``drop_rate``, ...), or the strict load fails.
    The model comes back in training mode, like a model from ``create_model``.

    Raises:
        ValueError: ``name`` has no released weights (DeepViT, T2T-ViT, ...).
        WeightsUnavailableError: an OSError; the weights could not be downloaded and are
            not in the Hugging Face cache.
        ModuleNotFoundError: timm, huggingface_hub or (CvT) transformers is missing; the
            message names the install command.
    """
    source, weights_id = pretrained_source(name)
    config = get_config(name, **overrides)  # a TypeError for an unknown field, before any download
    state_dict = convert_state_dict(name, _reference_state_dict(name, source, weights_id), source)
    model = model_class(name)(config)
    head = _head_keys(name, overrides)
    if not head:
        model.load_state_dict(state_dict, strict=True)
        return model
    missing, unexpected = model.load_state_dict({k: v for k, v in state_dict.items() if k not in head}, strict=False)
    if set(missing) - head or unexpected:
        raise RuntimeError(f"loading {name!r} without its head: missing {missing}, unexpected {unexpected}")
    return model


def data_config(name: str) -> dict[str, Any]:
    """timm's evaluation data config for ``name``: input_size, interpolation, mean, std, crop_pct, crop_mode.

    timm-named models: ``timm.data.resolve_data_config`` of timm's default pretrained config.
    CvT: the values of the Hugging Face repositories' ``preprocessor_config.json``
    (``ConvNextImageProcessor``: bicubic, ImageNet mean and std, resize the short side to
    224 / 0.875 then centre-crop 224; at 384 px a plain resize to 384 x 384), written as a
    timm data config with timm's ImageNet constants. Other models: timm's defaults at the
    model's image size.
    """
    _require("timm")
    from timm.data.config import resolve_data_config
    from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    source = pretrained_sources().get(name, (None, None))[0]
    size = get_config(name).img_size
    if source == "timm":
        pretrained_cfg = dataclasses.asdict(_timm_cfg(name))
    elif source == "hf":
        pretrained_cfg = {
            "input_size": (3, size, size),
            "interpolation": "bicubic",
            "mean": IMAGENET_DEFAULT_MEAN,
            "std": IMAGENET_DEFAULT_STD,
            "crop_pct": 0.875 if size < 384 else 1.0,
            "crop_mode": "center" if size < 384 else "squash",
        }
    else:
        pretrained_cfg = {"input_size": (3, size, size)}
    return resolve_data_config(pretrained_cfg=pretrained_cfg)


def load_image_tensor(name: str, image: Any) -> Tensor:
    """A photo as ``name``'s pretrained model expects it.

    Args:
        name: a ``vitlab`` model name.
        image: a PIL image, or an array (H, W, 3) or (H, W) of uint8 (``skimage.data.chelsea()``).

    Shape: image -> (1, 3, H, W) float32, resized, centre-cropped and normalised by timm's
    ``create_transform`` with :func:`data_config`.
    """
    _require("timm")
    from PIL import Image
    from timm.data.transforms_factory import create_transform

    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            raise TypeError(f"an array image must be uint8 (0-255), got {image.dtype}")
        image = Image.fromarray(image)
    if not isinstance(image, Image.Image):
        raise TypeError(f"image must be a PIL image or a uint8 array, got {type(image).__name__}")
    transform: Any = create_transform(**data_config(name), is_training=False)  # one Compose at eval
    tensor: Tensor = transform(image.convert("RGB"))
    return tensor.unsqueeze(0)


@cache
def _imagenet_info() -> Any:
    from timm.data.imagenet_info import ImageNetInfo

    return ImageNetInfo()


def top_k(logits: Tensor, k: int = 5) -> list[tuple[str, float]]:
    """The ``k`` most likely ImageNet-1k classes: ``[("tabby, tabby cat", 0.62), ...]``.

    Class names are timm's (``timm.data.ImageNetInfo``, shipped with timm).

    Shape: logits (1000,) or (1, 1000).
    """
    _require("timm")
    if logits.dim() == 2 and logits.shape[0] == 1:
        logits = logits[0]
    info = _imagenet_info()
    if logits.dim() != 1 or logits.shape[0] != info.num_classes():
        raise ValueError(f"expected ImageNet-1k logits of shape (1000,) or (1, 1000), got {tuple(logits.shape)}")
    probs = logits.detach().float().cpu().softmax(-1)
    values, indices = probs.topk(k)
    return [(info.index_to_description(int(i)), float(p)) for p, i in zip(values, indices, strict=True)]
