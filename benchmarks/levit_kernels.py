"""Which SDPA kernel LeViT's fused attention runs on CPU: flash on large maps, none on small ones.

    .venv/bin/python benchmarks/levit_kernels.py

LeViT's speed path (``vitlab.models.levit.fused_biased_attention``) pads q and k to the
value width so that ``F.scaled_dot_product_attention`` can take its flash kernel on CPU,
and runs the explicit computation on maps smaller than ``CPU_FLASH_MIN_LOGITS`` per head,
where flash does not pay off (benchmarks/README.md). Which kernel PyTorch picks is
PyTorch's business and can change with its version, so this is a check to run next to
the throughput benchmark, not a unit test (the unit tests check that both paths give the
same outputs). It profiles one inference pass of a layer with 144 x 144 maps and one with
36 x 36 maps and exits with status 1 if the kernels are not the expected ones.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from vitlab.models import levit
from vitlab.models.levit import LeViTAttention

FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"


def sdpa_kernels(layer: nn.Module, x: torch.Tensor) -> set[str]:
    """The SDPA kernels one inference pass of ``layer`` runs."""
    with torch.inference_mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        layer(x)
    return {e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product")}


def layer_for(resolution: int) -> LeViTAttention:
    """A stage-1-like LeViT attention layer on a ``resolution x resolution`` map (values twice
    as wide as keys), with random attention biases, in eval mode."""
    torch.manual_seed(0)
    layer = LeViTAttention(16, 16, key_dim=4, num_heads=2, attn_ratio=2, resolution=resolution).eval()
    with torch.no_grad():
        layer.attention_biases.normal_()
    return layer


def check() -> list[tuple[str, set[str], set[str]]]:
    """(case, expected kernels, kernels that ran) for a large and a small map, on CPU."""
    cases = []
    for resolution, expected in ((12, {FLASH}), (6, set())):
        n = resolution * resolution
        big = n * n >= levit.CPU_FLASH_MIN_LOGITS
        label = f"{n} x {n} maps ({'at least' if big else 'below'} CPU_FLASH_MIN_LOGITS = {levit.CPU_FLASH_MIN_LOGITS})"
        cases.append((label, expected, sdpa_kernels(layer_for(resolution), torch.randn(2, n, 16))))
    return cases


def main() -> int:
    print(f"torch {torch.__version__}")
    ok = True
    for label, expected, ran in check():
        good = ran == expected
        ok &= good
        want, got = sorted(expected) or "no SDPA kernel", sorted(ran) or "none"
        print(f"{'ok  ' if good else 'FAIL'} {label}: expected {want}, ran {got}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
