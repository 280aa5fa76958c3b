"""vitlab.family: MACs match the reference numbers, token counts match hand counts, every
property in FAMILY_PROPERTIES is true of the code, and the tiny models share one budget.

Profiling runs on the meta device (shapes only), so the big presets cost no memory; this
file profiles about a dozen of them and stays well under a minute.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import vitlab
from vitlab.family import (
    FAMILY_PROPERTIES,
    TINY_CONFIGS,
    TINY_IMAGE_SIZE,
    _profile,
    attention_token_counts,
    build_on_meta,
    count_macs,
    family_of,
    format_tokens,
    input_size_of,
    macs_by_operator,
    model_table,
    tiny_model,
    tokens_per_stage,
)
from vitlab.layers import sincos_1d_position_embedding
from vitlab.models.cait import TalkingHeadAttn
from vitlab.models.cvt import ConvAttention
from vitlab.models.deepvit import ReAttention
from vitlab.models.levit import LeViTAttention
from vitlab.models.t2t_vit import TokenPerformer, TokenTransformer

# Impl. GMACs of book/reference_numbers.md, Table 1 (timm's models counted, or analytic where
# the model is not in timm: DeepViT, T2T-ViT, CvT). LeViT-128S: the paper's 0.305 GFLOPs
# (Graham et al., 2021, Table 3), which the table rounds to 0.31.
REFERENCE_GMACS = {
    "vit_base_patch16_224": 17.58,
    "deit_small_patch16_224": 4.61,
    "cait_xxs24_224": 2.53,
    "pit_s_224": 2.88,
    "levit_128s": 0.305,
    "crossvit_small_240": 5.63,
    "cvt_13": 4.57,
    "t2t_vit_14": 4.78,
    "deepvit_s": 6.33,
}


@cache
def profiled(name: str) -> tuple[nn.Module, int, list[int]]:
    """A preset on the meta device, its MACs and the token count of every attention layer
    (one counted forward pass per preset, shared by the tests)."""
    model = build_on_meta(name)
    flops, counts = _profile(model, input_size_of(name))
    return model, sum(flops.values()) // 2, counts


@pytest.fixture(scope="module")
def profiles() -> dict[str, tuple[nn.Module, list[int]]]:
    """Each family's main preset with its token counts."""
    out = {}
    for family, props in FAMILY_PROPERTIES.items():
        model, _, counts = profiled(props.main_model)
        out[family] = (model, counts)
    return out


# ---------------------------------------------------------------- registry and families


def test_every_model_has_a_family_and_every_family_a_main_model() -> None:
    families = {family_of(name) for name in vitlab.list_models()}
    assert families == set(FAMILY_PROPERTIES) == set(TINY_CONFIGS)
    for family, props in FAMILY_PROPERTIES.items():
        assert family_of(props.main_model) == family
        assert props.cite in {
            "dosovitskiy2021vit",
            "touvron2021deit",
            "zhou2021deepvit",
            "touvron2021cait",
            "yuan2021t2t",
            "chen2021crossvit",
            "heo2021pit",
            "graham2021levit",
            "wu2021cvt",
        }
    assert family_of("pit_s_224") == "pit" and family_of("t2t_vit_t_14") == "t2t_vit"


# ---------------------------------------------------------------- MACs


@pytest.mark.parametrize("name", sorted(REFERENCE_GMACS))
def test_macs_match_the_reference_numbers(name: str) -> None:
    gmacs = profiled(name)[1] / 1e9
    assert gmacs == pytest.approx(REFERENCE_GMACS[name], rel=0.02)


def tiny_vit() -> nn.Module:
    return vitlab.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=16, in_chans=1, embed_dim=32, depth=2, num_heads=2,
        num_classes=10,
    )  # fmt: skip


def test_macs_of_a_tiny_vit_by_hand() -> None:
    N, D, K, P, C, depth = 5, 32, 10, 16, 1, 2  # 4 patches + cls
    patch_embed = 4 * (C * P * P) * D
    per_block = N * (3 * D * D + D * D + 2 * 4 * D * D) + 2 * N * N * D  # linears, then q k^T and attn v
    expected = patch_embed + depth * per_block + D * K
    assert count_macs(tiny_vit(), (1, C, 32, 32)) == expected == 159_168
    assert count_macs(tiny_vit(), (3, C, 32, 32)) == 3 * expected  # per batch
    by_op = macs_by_operator(tiny_vit(), (1, C, 32, 32))
    assert by_op == {"addmm": 5 * depth * 12 * D * D + D * K, "bmm": depth * 2 * N * N * D, "convolution": patch_embed}


def test_fused_attention_on_the_cpu_is_invisible_to_the_flop_counter() -> None:
    # Why count_macs switches to the explicit path: torch has no FLOP formula for its CPU
    # flash kernel, so the fused path's matrix products count as 0 on real CPU tensors.
    q = k = v = torch.randn(1, 2, 5, 16)
    counter = FlopCounterMode(display=False)
    with counter:
        F.scaled_dot_product_attention(q, k, v)
    assert counter.get_total_flops() == 0
    model = tiny_vit().eval()
    fused_count = count_macs(vitlab.set_fused_attention(model, True), (1, 1, 32, 32))
    explicit_count = count_macs(vitlab.set_fused_attention(tiny_vit(), False), (1, 1, 32, 32))
    assert fused_count == explicit_count == 159_168


def test_meta_and_real_tensors_count_the_same() -> None:
    with torch.device("meta"):
        meta = tiny_vit()
    assert count_macs(meta, (2, 1, 32, 32)) == count_macs(tiny_vit(), (2, 1, 32, 32))


def test_count_macs_leaves_the_model_as_it_was() -> None:
    model = tiny_vit().train()
    model.cls_token.requires_grad_(False)
    count_macs(model, (1, 1, 32, 32))
    assert model.training and not model.cls_token.requires_grad and model.pos_embed.requires_grad
    assert all(block.attn.fused_attn for block in model.blocks)
    assert not any(module._forward_pre_hooks for module in model.modules())


def test_count_macs_rejects_a_wrong_input_size() -> None:
    with pytest.raises(ValueError, match=r"input_size must be \(B, C, H, W\), got \(1, 32, 32\)"):
        count_macs(tiny_vit(), (1, 32, 32))


# ---------------------------------------------------------------- tokens


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("vit_base_patch16_224", (14 * 14 + 1,)),
        ("vit_base_patch32_224", (7 * 7 + 1,)),
        ("deit_small_distilled_patch16_224", (196 + 2,)),  # cls and dist tokens
        ("cait_xxs24_224", (196, 197)),  # patches alone, then [cls, patches] in class attention
        ("t2t_vit_14", (56 * 56, 28 * 28, 14 * 14 + 1)),  # soft splits k7 s4, k3 s2, k3 s2
        ("crossvit_small_240", ((240 // 12) ** 2 + 1, (224 // 16) ** 2 + 1)),  # two branches
        ("pit_s_224", (27 * 27 + 1, 14 * 14 + 1, 7 * 7 + 1)),  # (224 - 16) / 8 + 1 = 27
        ("pit_b_224", (31 * 31 + 1, 16 * 16 + 1, 8 * 8 + 1)),  # (224 - 14) / 7 + 1 = 31
        ("levit_128s", (14 * 14, 7 * 7, 4 * 4)),  # no cls token
        ("cvt_13", (56 * 56, 28 * 28, 14 * 14 + 1)),  # cls token in stage 3 only
    ],
)
def test_tokens_per_stage_by_hand(name: str, expected: tuple[int, ...]) -> None:
    assert tuple(dict.fromkeys(profiled(name)[2])) == expected
    if name == "pit_s_224":  # the public function says the same
        assert tokens_per_stage(name) == expected


def test_tokens_are_formatted_as_stages_or_branches() -> None:
    assert format_tokens("pit", (730, 197, 50)) == "730 → 197 → 50"
    assert format_tokens("crossvit", (401, 197)) == "401 ∥ 197"


def test_model_table_rows() -> None:
    rows = model_table(["levit_128s", "pit_s_224", "pit_ti_224"])
    assert [r["model"] for r in rows] == ["pit_ti_224", "pit_s_224", "levit_128s"]  # chapter order, then MACs
    pit_s = rows[1]
    assert pit_s == {
        "model": "pit_s_224", "family": "pit", "img_size": 224, "params": 23_461_912,
        "macs": profiled("pit_s_224")[1], "tokens": (730, 197, 50),
    }  # fmt: skip


# ---------------------------------------------------------------- properties are true of the code


def named_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


@pytest.mark.parametrize("family", list(FAMILY_PROPERTIES))
def test_position_embedding_property(profiles, family: str) -> None:
    model, _ = profiles[family]
    text = FAMILY_PROPERTIES[family].position_embedding
    tables = {n: t for n, t in named_tensors(model).items() if "pos_embed" in n}
    biases = [n for n in named_tensors(model) if n.endswith("attention_biases")]
    if text.startswith("none"):
        assert not tables
        assert bool(biases) == ("attention bias" in text)
        return
    assert tables and not biases
    learned = {t.requires_grad for t in tables.values()}
    assert learned == ({True} if text.startswith("learned") else {False})
    config = model.config
    if "per branch" in text:
        assert [tuple(t.shape) for t in tables.values()] == [
            (1, n + 1, d) for n, d in zip(config.num_patches, config.embed_dim)
        ]
    elif "spatial map" in text:  # PiT: (1, C, H, W), added before the tokens are flattened
        (table,) = tables.values()
        side = config.stage_sizes[0]
        assert table.ndim == 4 and table.shape[-2:] == (side, side)
    else:
        (table,) = tables.values()
        prefix = 0 if "patches only" in text else 1
        assert table.shape[1] == config.num_patches + prefix
    if text.startswith("fixed sin-cos"):  # T2T: a frozen sinusoid table; values on a small real model
        real = vitlab.create_model("t2t_vit_14", embed_dim=16, num_heads=2, depth=1)
        torch.testing.assert_close(real.pos_embed[0], sincos_1d_position_embedding(197, 16))


def test_distilled_deit_has_two_prefix_positions() -> None:
    model = build_on_meta("deit_small_distilled_patch16_224")
    assert model.pos_embed.shape == (1, 196 + 2, 384)


def first_tokenizer(model: nn.Module) -> nn.Module:
    """The first conv or unfold a model applies to the image (module registration order)."""
    return next(m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Unfold)))


def kernel_stride(module: nn.Module) -> tuple[int, int]:
    layer: Any = module  # nn.Conv2d or nn.Unfold
    k, s = layer.kernel_size, layer.stride
    return (k if isinstance(k, int) else k[0]), (s if isinstance(s, int) else s[0])


@pytest.mark.parametrize("family", list(FAMILY_PROPERTIES))
def test_token_embedding_property(profiles, family: str) -> None:
    model, _ = profiles[family]
    text = FAMILY_PROPERTIES[family].token_embedding
    kernel, stride = kernel_stride(first_tokenizer(model))
    assert (kernel > stride) == text.startswith("overlapping")
    assert text.startswith(("overlapping", "non-overlapping"))
    numbers = re.search(r"k(\d+) s(\d+)", text)
    if numbers:  # the first kernel and stride named in the table
        assert (kernel, stride) == (int(numbers[1]), int(numbers[2]))
    if "unfold" in text:
        assert isinstance(first_tokenizer(model), nn.Unfold)
    if "4x k3 s2" in text:  # LeViT's stem
        convs = [m for m in model.stem.modules() if isinstance(m, nn.Conv2d)]
        assert [kernel_stride(c) for c in convs] == [(3, 2)] * 4
    if "2 patch sizes" in text:  # CrossViT: one non-overlapping patch embedding per branch
        sizes = [kernel_stride(e.proj) for e in model.patch_embed]
        assert sizes == [(12, 12), (16, 16)]


def projections(model: nn.Module) -> list[nn.Module]:
    return [
        m
        for m in model.modules()
        if isinstance(m, (vitlab.layers.Attention, LeViTAttention, ConvAttention, ReAttention, TalkingHeadAttn))
    ]


@pytest.mark.parametrize("family", list(FAMILY_PROPERTIES))
def test_attention_projection_property(profiles, family: str) -> None:
    model, _ = profiles[family]
    text = FAMILY_PROPERTIES[family].attention_projection
    layers = projections(model)
    assert layers
    for layer in layers:
        if text.startswith("linear + BatchNorm"):  # LeViT: LinearNorm = Linear without bias + BN
            linear_norm = layer.qkv if layer.stride == 1 else layer.kv
            assert isinstance(linear_norm.bn, nn.BatchNorm1d) and linear_norm.linear.bias is None
        elif text.startswith("depthwise conv"):  # CvT: depthwise conv + BN on the map, then Linear
            for name in "qkv":
                conv = getattr(layer, f"conv_proj_{name}").conv
                assert conv.groups == conv.in_channels == conv.out_channels
                assert isinstance(getattr(layer, f"proj_{name}"), nn.Linear)
        else:
            assert text.startswith("linear") and isinstance(layer.qkv, nn.Linear)
    kinds = {type(layer) for layer in layers}
    assert (ReAttention in kinds) == ("re-attention" in text)
    assert (TalkingHeadAttn in kinds) == ("talking heads" in text)
    if "cross-attention" in text:
        assert all(type(f.attn).__name__ == "CrossAttention" for block in model.blocks for f in block.fusion)


@pytest.mark.parametrize("family", list(FAMILY_PROPERTIES))
def test_hierarchical_property(profiles, family: str) -> None:
    """ "yes": the token count shrinks from stage to stage; "partial": it shrinks only before
    the backbone (T2T's tokenization); "no": it never shrinks (per branch for CrossViT)."""
    model, counts = profiles[family]
    props = FAMILY_PROPERTIES[family]
    stages = tuple(dict.fromkeys(counts))
    shrinks = len(stages) > 1 and all(b < a for a, b in zip(stages, stages[1:]))
    if props.hierarchical.startswith("yes"):
        assert shrinks and len(stages) == 3
    elif props.hierarchical.startswith("partial"):
        assert shrinks
        mixers = [m for m in model.modules() if isinstance(m, (TokenPerformer, TokenTransformer))]
        assert len(counts) - len(mixers) == model.config.depth  # the backbone blocks ...
        assert set(counts[len(mixers) :]) == {stages[-1]}  # ... all read one token count
    elif props.branches == 2:
        assert props.hierarchical.startswith("no") and len(stages) == 2
        # Each branch's blocks read one count, in every encoder: S 401, L 197.
        assert branch_inputs(model, input_size_of(props.main_model)) == {0: {stages[0]}, 1: {stages[1]}}
    else:
        assert props.hierarchical.startswith("no")
        assert all(b >= a for a, b in zip(counts, counts[1:]))  # CaiT: 196, then 197 with cls


def branch_inputs(model: nn.Module, size: tuple[int, ...]) -> dict[int, set[int]]:
    """CrossViT: token counts read by the self-attention layers of branch 0 (S) and 1 (L)."""
    seen: dict[int, set[int]] = {0: set(), 1: set()}
    hooks = [
        m.register_forward_pre_hook(lambda _, a, i=i: seen[i].add(a[0].shape[1]))
        for encoder in model.blocks
        for i, branch in enumerate(encoder.blocks)
        for m in branch.modules()
        if isinstance(m, vitlab.layers.Attention)
    ]
    try:
        count_macs(model, size)
    finally:
        for h in hooks:
            h.remove()
    return seen


# ---------------------------------------------------------------- tiny models


@pytest.fixture(scope="module")
def tiny_models() -> dict[str, nn.Module]:
    vitlab.seed_everything(0)
    return {family: tiny_model(family) for family in TINY_CONFIGS}


def test_tiny_models_share_one_parameter_budget(tiny_models) -> None:
    counts = {family: vitlab.count_parameters(m) for family, m in tiny_models.items()}
    assert max(counts.values()) <= 1.2 * min(counts.values()), counts  # within ±20% of each other
    assert all(30_000 <= n <= 40_000 for n in counts.values()), counts


def test_tiny_models_classify_digit_sized_images(tiny_models) -> None:
    x = torch.randn(4, 1, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE, generator=torch.Generator().manual_seed(0))
    for family, model in tiny_models.items():
        with torch.no_grad():
            assert model.eval()(x).shape == (4, 10), family


def test_tiny_models_keep_the_paper_strides(tiny_models) -> None:
    size = (1, 1, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE)
    stages = {f: tuple(dict.fromkeys(attention_token_counts(m, size))) for f, m in tiny_models.items()}
    assert stages == {
        "vit": (5,), "deit": (6,), "deepvit": (5,), "cait": (4, 5),  # a 2x2 grid (+ cls, dist)
        "t2t_vit": (64, 16, 5), "crossvit": (17, 5), "pit": (10, 5, 2), "levit": (4, 1), "cvt": (64, 16, 5),
    }  # fmt: skip
    assert tiny_models["deepvit"].patch_embed.conv1.out_channels == 6  # the one stem made narrower
    assert tiny_models["deepvit"].config.stem_dim == 6  # ... through its config, so it can be rebuilt


def test_tiny_model_rejects_an_unknown_family() -> None:
    with pytest.raises(ValueError, match=r"unknown family 'resnet'; expected one of \['vit', 'deit'"):
        tiny_model("resnet")
