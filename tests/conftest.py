"""Shared test helpers: reference models, logits comparison, parameter counts."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest
import torch

import vitlab


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: a test that takes more than ~20 s on 2 CPU cores")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def random_images(batch: int = 2, size: int | tuple[int, int] = 224, channels: int = 3, seed: int = 0) -> torch.Tensor:
    """Deterministic N(0, 1) images. Shape: (batch, channels, H, W)."""
    h, w = (size, size) if isinstance(size, int) else size
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, channels, h, w, generator=generator)


@torch.no_grad()
def perturb_(module: torch.nn.Module, seed: int = 0, std: float = 0.02) -> torch.nn.Module:
    """Add noise to every parameter and BatchNorm statistic, in place.

    Random inits hide conversion bugs: zero biases, LayerScale at 1e-5 and fresh
    BatchNorm statistics make a swapped or dropped tensor invisible in the logits.
    """
    generator = torch.Generator().manual_seed(seed)
    for param in module.parameters():
        param.add_(torch.randn(param.shape, generator=generator) * std)
    for sub in module.modules():
        if isinstance(sub, torch.nn.modules.batchnorm._BatchNorm) and sub.running_mean is not None:
            sub.running_mean.add_(torch.randn(sub.running_mean.shape, generator=generator) * 0.1)
            sub.running_var.mul_(0.5 + torch.rand(sub.running_var.shape, generator=generator))
    return module


def count_on_meta(name: str, **overrides) -> int:
    """Parameter count of a preset built on the meta device (shapes only: no memory, instant)."""
    with torch.device("meta"):
        return vitlab.count_parameters(vitlab.create_model(name, **overrides))


def require_reference(module: str) -> ModuleType:
    """Import a reference implementation (``timm``, ``transformers``): skip the test where it
    is missing, or fail with ``VITLAB_REQUIRE_REFERENCES=1`` (CI), so that the reference
    comparisons cannot silently stop running."""
    if os.environ.get("VITLAB_REQUIRE_REFERENCES") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module)


def timm_model(name: str, perturb: bool = True, **kwargs) -> torch.nn.Module:
    """A randomly initialised timm model (no download), in eval mode.

    With ``perturb`` (the default) every parameter and BatchNorm statistic is moved off
    its initial value, so that a weight-conversion test can fail.
    """
    timm = require_reference("timm")
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **kwargs).eval()
    return perturb_(model) if perturb else model


def load_reference(name: str, reference: torch.nn.Module, source: str = "timm", **overrides) -> torch.nn.Module:
    """A vitlab model carrying ``reference``'s weights (strict load), in eval mode."""
    model = vitlab.create_model(name, **overrides).eval()
    state_dict = vitlab.convert_state_dict(name, reference.state_dict(), source)
    model.load_state_dict(state_dict, strict=True)
    return model


def assert_same_logits(
    model: torch.nn.Module, reference: torch.nn.Module, images: torch.Tensor, atol: float = 1e-4
) -> None:
    """Both models in eval mode, fp32, CPU: the same logits within ``atol``."""
    with torch.no_grad():
        expected = reference(images)
        got = model(images)
    if hasattr(expected, "logits"):  # HuggingFace output object
        expected = expected.logits
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} vs reference {tuple(expected.shape)}"
    torch.testing.assert_close(got, expected, atol=atol, rtol=0)
