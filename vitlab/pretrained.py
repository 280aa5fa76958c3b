"""Released weights: ``vitlab.create_model(name, pretrained=True)``, a photo in, class names out.

The reference library loads the weights from the Hugging Face hub: timm its default
pretrained tag (``timm/<model>.<tag>``), ``transformers`` CvT (``microsoft/cvt-*``); vitlab
converts that model's state dict (:func:`vitlab.convert_state_dict`) and loads it strictly.
``huggingface_hub`` caches the files (``HF_HOME``) and honours ``HF_HUB_OFFLINE=1``. A cached
copy loads with ``local_files_only=True``, without network. timm, huggingface_hub and
transformers are the ``vitlab[pretrained]`` extra, imported when used.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import numpy as np
from torch import Tensor, nn

from vitlab.registry import _module_for, convert_state_dict, get_config, model_class

T = TypeVar("T")

# HuggingFace hub repositories of the models whose reference is HF ``transformers``.
HF_REPO_IDS = {"cvt_13": "microsoft/cvt-13", "cvt_21": "microsoft/cvt-21", "cvt_w24_384": "microsoft/cvt-w24-384-22k"}

# Families whose official weights neither timm nor the Hugging Face hub carries: where the
# authors publish them (checked in each repository's README).
UNRELEASED = {
    "deepvit": "the README of github.com/zhoudaquan/dvit_repo (section 2, 'DeepViT Models') links them on Google Drive",
    "t2t_vit": "the GitHub releases of github.com/yitu-opensource/T2T-ViT (README section 2, 'T2T-ViT Models')",
}

# pyproject.toml's [pretrained] extra, installed as in every chapter's Colab setup cell.
INSTALL_COMMAND = (
    'pip install "vitlab[pretrained] @ git+https://github.com/vitlab-course/vit-lab@main" '
    '(in a clone of the repository: pip install -e ".[pretrained]")'
)


class WeightsUnavailableError(OSError):
    """The released weights are not in the Hugging Face cache and could not be downloaded."""


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


def pretrained_source(name: str) -> tuple[str, str]:
    """``(source, weights id)`` of ``name``'s released weights, or a ValueError saying why none:
    ``("timm", "vit_tiny_patch16_224.augreg_in21k_ft_in1k")``, timm's default tag (timm's first,
    best weights, read from its registry offline), or ``("hf", "microsoft/cvt-13")``."""
    _require("timm", "huggingface_hub")
    import timm

    module = _module_for(name)  # a KeyError with close names for an unknown model
    if hasattr(module, "convert_hf") and name in HF_REPO_IDS:
        return "hf", HF_REPO_IDS[name]
    cfg = timm.models.get_pretrained_cfg(name) if hasattr(module, "convert_timm") and timm.is_model(name) else None
    if cfg is not None and cfg.hf_hub_id:
        return "timm", f"{name}.{cfg.tag}"
    where = UNRELEASED.get(module.__name__.rsplit(".", 1)[-1])
    why = f"the authors publish theirs outside both: {where}" if where else "timm's registry has no tag for it"
    raise ValueError(
        f"{name!r} has no released weights in timm or on the Hugging Face hub, so pretrained=True cannot load "
        f"any ({why}). vitlab has no converter for other checkpoints; create_model({name!r}) gives a randomly "
        f"initialised model."
    )


def has_pretrained(name: str) -> bool:
    """Whether ``create_model(name, pretrained=True)`` has released weights to load."""
    try:
        pretrained_source(name)
    except ValueError:
        return False
    return True


def _cached_or_downloaded(name: str, repo_id: str, filename: str, load: Callable[..., T]) -> T:
    """``load(local_files_only=True)``; else, once the hub answers for ``filename``, ``load()``.

    That one metadata request is not retried, so it fails in seconds where the hub cannot be
    reached; a download retries each file for half a minute before it gives up.
    """
    import huggingface_hub

    try:
        return load(local_files_only=True)  # the cached copy, no network
    except OSError:  # not cached: LocalEntryNotFoundError (hub), OSError (transformers)
        pass
    # huggingface_hub's errors are OSErrors (OfflineModeIsEnabled under HF_HUB_OFFLINE=1);
    # those of its HTTP client (httpx, or httpx2 for huggingface_hub 2) are not.
    errors = (OSError, *(sys.modules[m].HTTPError for m in ("httpx", "httpx2") if m in sys.modules))
    try:
        huggingface_hub.get_hf_file_metadata(huggingface_hub.hf_hub_url(repo_id, filename))  # one try
        return load()
    except errors as error:
        offline = " (HF_HUB_OFFLINE is set)" if huggingface_hub.is_offline_mode() else ""
        raise WeightsUnavailableError(
            f"could not download the released weights of {name!r}{offline}: the Hugging Face repository "
            f"{repo_id!r} is not in the Hugging Face cache ({huggingface_hub.constants.HF_HUB_CACHE}) and the "
            f"hub cannot be reached. They need the internet once (Colab is online), or a cached copy: run "
            f"huggingface_hub.snapshot_download({repo_id!r}) on a machine that is online and copy its HF_HOME "
            f"folder here (or point HF_HOME / HF_HUB_CACHE at a copy). Cause: {type(error).__name__}: {error}"
        ) from error


def _reference_state_dict(name: str, source: str, weights_id: str) -> dict[str, Tensor]:
    """The reference model's state dict with its released weights, loaded by its own library."""
    if source == "timm":
        import huggingface_hub
        import timm

        cfg: Any = timm.models.get_pretrained_cfg(weights_id)
        filename = cfg.hf_hub_filename or "model.safetensors"  # what every timm/ repository holds

        download = partial(huggingface_hub.hf_hub_download, cfg.hf_hub_id, filename)
        # timm's documented file override: its checkpoint filter and strict load, as pretrained=True.
        overlay = {"file": _cached_or_downloaded(name, cfg.hf_hub_id, filename, download)}
        return timm.create_model(weights_id, pretrained=True, pretrained_cfg_overlay=overlay).state_dict()

    _require("transformers")  # CvT's reference
    from transformers import CvtForImageClassification

    load = partial(CvtForImageClassification.from_pretrained, weights_id)
    return _cached_or_downloaded(name, weights_id, "config.json", load).state_dict()


def load_released(name: str, **overrides: Any) -> nn.Module:
    """``vitlab.create_model(name, pretrained=True, **overrides)``, in training mode.

    ``num_classes`` may differ from the released head: the backbone is loaded and the head
    is freshly initialised (fine-tuning), as timm does. Any other override must keep every
    weight's shape (``drop_path_rate``, ``drop_rate``, ...), or the strict load fails.

    Raises:
        ValueError: ``name`` has no released weights (DeepViT, T2T-ViT, ...).
        WeightsUnavailableError: an OSError naming the model; no cached copy, and the hub
            cannot be reached (or ``HF_HUB_OFFLINE=1``).
        ModuleNotFoundError: timm, huggingface_hub or (CvT) transformers is missing.
    """
    source, weights_id = pretrained_source(name)
    config = get_config(name, **overrides)  # a TypeError for an unknown field, before any download
    released = convert_state_dict(name, _reference_state_dict(name, source, weights_id), source)
    model = model_class(name)(config)
    own = model.state_dict()  # with a new num_classes, the released head (another shape) is left out
    head = {k for k, v in released.items() if "num_classes" in overrides and k in own and own[k].shape != v.shape}
    missing, unexpected = model.load_state_dict({k: v for k, v in released.items() if k not in head}, strict=False)
    if set(missing) != head or unexpected:
        raise RuntimeError(f"loading {name!r}: missing {missing} (head: {sorted(head)}), unexpected {unexpected}")
    return model


def data_config(name: str) -> dict[str, Any]:
    """timm's evaluation data config for ``name``: input_size, interpolation, mean, std, crop_pct, crop_mode.

    timm-named models: ``timm.data.resolve_data_config`` of timm's default pretrained config.
    CvT: the values of the ``microsoft/cvt-*`` ``preprocessor_config.json`` (bicubic, ImageNet
    mean and std, short side to 224 / 0.875 then centre-crop; at 384 px a plain resize).
    Other models: timm's defaults at the model's image size.
    """
    _require("timm")
    from timm.data.config import resolve_data_config
    from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
    from timm.models import get_pretrained_cfg

    source = pretrained_source(name)[0] if has_pretrained(name) else None
    size = get_config(name).img_size
    cfg: dict[str, Any] = {"input_size": (3, size, size)}
    if source == "timm":
        cfg = get_pretrained_cfg(name).to_dict()  # pyright: ignore[reportOptionalMemberAccess]
    elif source == "hf":
        small = size < 384
        cfg |= {"interpolation": "bicubic", "mean": IMAGENET_DEFAULT_MEAN, "std": IMAGENET_DEFAULT_STD}
        cfg |= {"crop_pct": 0.875 if small else 1.0, "crop_mode": "center" if small else "squash"}
    return resolve_data_config(pretrained_cfg=cfg)


def load_image_tensor(name: str, image: Any) -> Tensor:
    """A photo (PIL image, or uint8 array (H, W, 3) or (H, W)) as ``name``'s pretrained model
    expects it: timm's ``create_transform`` of :func:`data_config`.

    Shape: image -> (1, 3, H, W) float32.
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
    transform: Any = create_transform(**data_config(name), is_training=False)
    return transform(image.convert("RGB")).unsqueeze(0)


def top_k(logits: Tensor, k: int = 5) -> list[tuple[str, float]]:
    """The ``k`` most likely ImageNet-1k classes, named by timm: ``[("tabby, tabby cat", 0.62), ...]``.

    Shape: logits (1000,) or (1, 1000).
    """
    _require("timm")
    from timm.data.imagenet_info import ImageNetInfo

    logits = logits[0] if logits.dim() == 2 and logits.shape[0] == 1 else logits
    info = ImageNetInfo()  # timm's class names, shipped with timm
    if logits.dim() != 1 or logits.shape[0] != info.num_classes():
        raise ValueError(f"expected ImageNet-1k logits of shape (1000,) or (1, 1000), got {tuple(logits.shape)}")
    values, indices = logits.detach().float().cpu().softmax(-1).topk(k)
    return [(info.index_to_description(int(i)), float(p)) for p, i in zip(values, indices, strict=True)]
