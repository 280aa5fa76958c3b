"""Shared test helpers: reference models, logits comparison, parameter counts."""

from __future__ import annotations

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


def timm_model(name: str, **kwargs) -> torch.nn.Module:
    """A randomly initialised timm model (no download), in eval mode."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, **kwargs).eval()


def load_reference(name: str, reference: torch.nn.Module, source: str = "timm", **overrides) -> torch.nn.Module:
    """A vitlab model carrying ``reference``'s weights (strict load), in eval mode."""
    model = vitlab.create_model(name, **overrides).eval()
    state_dict = vitlab.convert_state_dict(name, reference.state_dict(), source)
    model.load_state_dict(state_dict, strict=True)
    return model


def assert_same_logits(model: torch.nn.Module, reference: torch.nn.Module, images: torch.Tensor, atol: float = 1e-4) -> None:
    """Both models in eval mode, fp32, CPU: the same logits within ``atol``."""
    with torch.no_grad():
        expected = reference(images)
        got = model(images)
    if hasattr(expected, "logits"):  # HuggingFace output object
        expected = expected.logits
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} vs reference {tuple(expected.shape)}"
    torch.testing.assert_close(got, expected, atol=atol, rtol=0)
