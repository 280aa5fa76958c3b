"""Every family under bf16 autocast, masked attention without NaNs, torch.compile."""

from __future__ import annotations

import pytest
import torch

import vitlab
from conftest import random_images
from vitlab.layers import Attention
from vitlab.registry import _model_modules

# The smallest preset of each paper file.
ONE_PER_FAMILY = {
    "vit": "vit_tiny_patch16_224",
    "deit": "deit_tiny_distilled_patch16_224",
    "deepvit": "deepvit_s",
    "cait": "cait_xxs24_224",
    "t2t_vit": "t2t_vit_t_14",
    "crossvit": "crossvit_tiny_240",
    "pit": "pit_ti_224",
    "levit": "levit_128s",
    "cvt": "cvt_13",
}


def test_every_family_is_covered() -> None:
    families = {module.__name__.rsplit(".", 1)[-1] for module in _model_modules().values()}
    assert families == set(ONE_PER_FAMILY)


@pytest.mark.parametrize("name", list(ONE_PER_FAMILY.values()))
def test_bf16_autocast_on_cpu_gives_finite_logits(name: str) -> None:
    model = vitlab.create_model(name).eval()
    images = random_images(2, model.config.img_size)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(images)
    assert logits.shape == (2, 1000)
    assert torch.isfinite(logits.float()).all()
    with torch.no_grad():
        reference = model(images)
    # bf16 keeps about 3 significant digits; the logits stay close to fp32's.
    assert (logits.float() - reference).abs().max() < 0.1 * reference.abs().max() + 0.05


@pytest.mark.parametrize("fused", [True, False])
def test_an_all_masked_query_row_gives_zeros_not_nan(fused: bool) -> None:
    attn = Attention(16, num_heads=2, fused_attn=fused).eval()
    x = torch.randn(2, 5, 16)
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[3] = False  # query 3 may attend to nothing
    out = attn(x, mask=mask)
    assert torch.isfinite(out).all()
    # With no keys, the attention output is zero, so the row is the projection's bias.
    torch.testing.assert_close(out[:, 3], attn.proj.bias.expand(2, -1))


def test_torch_compile_vit_small_matches_eager() -> None:
    # fullgraph: TorchDynamo traces the whole forward with no graph break. The aot_eager backend
    # runs the traced graph without generating C++ (inductor's code generation is PyTorch's to
    # test, and costs about 20 s of compiling on a fresh machine).
    model = vitlab.create_model("vit_small_patch16_224", depth=2).eval()  # two blocks compile as twelve do
    images = random_images(2)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(images), model(images), atol=1e-4, rtol=0)
