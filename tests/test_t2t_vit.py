"""T2T-ViT: trainable counts, soft-split token counts, token layers, qk_scale, bad configs.

Checks shared by every family live in tests/test_contract.py.

T2T-ViT is in neither timm nor HuggingFace, so there is no reference model to load here.
The official code (yitu-opensource/T2T-ViT, commit 0f63dc95) was instantiated outside the
repository: its state dict (every trainable parameter perturbed) loads into ours with
``strict=True`` and no renames, and on the explicit attention path the logits are
identical (max difference 0.0) for all six models (eval, CPU). For t2t_vit_t_14 and
t2t_vit_14 with the embed_dim scale the difference is 3e-6, and the fused path is within
3e-6 of the official one. These tests pin down what that check showed.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import vitlab
from conftest import perturb_, random_images
from vitlab.layers import Attention
from vitlab.models.t2t_vit import (
    SOFT_SPLITS,
    T2TViTConfig,
    TokenAttention,
    TokenPerformer,
    TokenTransformer,
    unfold_output_size,
)

# Trainable parameters, from the official code (T2T-ViT 0f63dc95; book/reference_numbers.md).
# All parameters (with the frozen sinusoid pos_embed and Performer w): tests/test_contract.py.
T2T_TRAINABLE = {
    "t2t_vit_t_14": 21_465_422,
    "t2t_vit_t_19": 39_084_686,
    "t2t_vit_t_24": 64_000_590,
    "t2t_vit_14": 21_465_806,
    "t2t_vit_19": 39_085_070,
    "t2t_vit_24": 64_000_974,
}
# Forward passes use a 2-block backbone: the T2T module, the part under test, is the same.
SHORT = dict(depth=2, num_classes=10)


def build_on_meta(name: str, **overrides) -> nn.Module:
    """The model without allocating or initialising the weights (fast for the -24 models)."""
    with torch.device("meta"):
        return vitlab.create_model(name, **overrides)


@pytest.mark.parametrize("name, expected", T2T_TRAINABLE.items())
def test_trainable_parameter_count(name: str, expected: int) -> None:
    assert vitlab.count_parameters(build_on_meta(name), trainable_only=True) == expected


@pytest.mark.parametrize("name", list(T2T_TRAINABLE))
def test_frozen_parameters_are_pos_embed_and_performer_w(name: str) -> None:
    model = build_on_meta(name)
    frozen = {n: tuple(p.shape) for n, p in model.named_parameters() if not p.requires_grad}
    D = model.config.embed_dim
    expected = {"pos_embed": (1, 197, D)}  # 75,648 / 88,256 / 100,864 for D = 384 / 448 / 512
    if model.config.tokens_type == "performer":
        expected |= {"tokens_to_token.attention1.w": (32, 64), "tokens_to_token.attention2.w": (32, 64)}
    assert frozen == expected
    all_params, trainable = vitlab.count_parameters(model), T2T_TRAINABLE[name]
    assert all_params - trainable == sum(math.prod(s) for s in expected.values())


# ---------------------------------------------------------------- soft split


def test_grid_sizes_and_token_counts() -> None:
    # book/reference_numbers.md, Table 2: 56^2 (dim 147) -> 28^2 (576) -> 14^2 (576).
    config = vitlab.get_config("t2t_vit_14")
    assert config.grid_sizes == [56, 28, 14]
    assert [s * s for s in config.grid_sizes] == [3136, 784, 196]
    assert config.num_patches == 196
    assert vitlab.get_config("t2t_vit_14", img_size=384).grid_sizes == [96, 48, 24]


@pytest.mark.parametrize("tokens_type", ["transformer", "performer"])
def test_token_shapes_through_the_t2t_module(tokens_type: str) -> None:
    model = vitlab.create_model("t2t_vit_14", tokens_type=tokens_type, **SHORT).eval()
    t2t = model.tokens_to_token
    shapes = []
    with torch.no_grad():
        x = t2t.soft_split0(random_images(1)).transpose(1, 2)
        shapes.append(tuple(x.shape))
        x = t2t.attention1(x)
        shapes.append(tuple(x.shape))
        x = t2t.restructurize(x)
        shapes.append(tuple(x.shape))
        x = t2t.soft_split1(x).transpose(1, 2)
        shapes.append(tuple(x.shape))
        x = t2t.soft_split2(t2t.restructurize(t2t.attention2(x))).transpose(1, 2)
        shapes.append(tuple(x.shape))
        shapes.append(tuple(t2t.project(x).shape))
    assert shapes == [(1, 3136, 147), (1, 3136, 64), (1, 64, 56, 56), (1, 784, 576), (1, 196, 576), (1, 196, 384)]


@pytest.mark.parametrize("size", [224, 384, 96, 57])
def test_token_count_formula_matches_unfold(size: int) -> None:
    side = size
    for kernel, stride, padding in SOFT_SPLITS:
        out = nn.Unfold(kernel_size=kernel, stride=stride, padding=padding)(torch.zeros(1, 1, side, side))
        side = unfold_output_size(side, kernel, stride, padding)
        assert out.shape[-1] == side * side


def test_reading_the_papers_overlap_as_the_stride_misses_every_count() -> None:
    # Pitfall 11: the paper's Eq. 3 divides by k - s with s the *overlap*, so k - s is the
    # stride. Reading s as the stride (dividing by k - stride) and dropping the "+1" of the
    # second factor misses every count, even with each bracket floored.
    def misread_count(h: int, w: int, k: int, s: int, p: int) -> int:
        return ((h + 2 * p - k) // (k - s) + 1) * ((w + 2 * p - k) // (k - s))

    right = [unfold_output_size(n, k, s, p) ** 2 for n, (k, s, p) in zip((224, 56, 28), SOFT_SPLITS)]
    wrong = [misread_count(n, n, k, s, p) for n, (k, s, p) in zip((224, 56, 28), SOFT_SPLITS)]
    assert right == [3136, 784, 196]
    assert wrong == [74 * 73, 56 * 55, 28 * 27] == [5402, 3080, 756]


def test_restructurize_is_the_inverse_of_flattening() -> None:
    image = torch.randn(2, 64, 56, 56)
    model = build_on_meta("t2t_vit_t_14")
    tokens = image.flatten(2).transpose(1, 2)  # (B, 3136, 64)
    torch.testing.assert_close(model.tokens_to_token.restructurize(tokens), image, atol=0, rtol=0)


# ---------------------------------------------------------------- token layers


def test_token_attention_uses_v_as_skip_and_the_input_width_scale() -> None:
    layer = TokenAttention(147, 64, fused_attn=False)
    assert layer.scale == 147**-0.5  # NOTE(paper): the input width, not q/k's 64
    assert layer.qkv.bias is None and layer.proj.bias is not None
    x = torch.randn(2, 50, 147)
    q, k, v = layer.qkv(x).split(64, dim=-1)
    attn = (q @ k.transpose(-2, -1) * 147**-0.5).softmax(dim=-1)
    torch.testing.assert_close(layer(x), v + layer.proj(attn @ v))


def test_token_transformer_changes_the_width() -> None:
    layer = TokenTransformer(576, 64)
    assert layer(torch.randn(1, 9, 576)).shape == (1, 9, 64)
    assert layer.mlp.fc1.out_features == 64  # mlp ratio 1
    assert all(m.eps == 1e-5 for m in layer.modules() if isinstance(m, nn.LayerNorm))


def test_performer_is_softmax_free_linear_attention() -> None:
    # phi(q) (phi(k)^T v) / (phi(q) sum phi(k)) equals the N x N attention matrix
    # A = phi(q) phi(k)^T with rows normalised, applied to v: same result, O(N) memory.
    layer = TokenPerformer(147, 64, drop=0.0).eval()
    assert layer.m == 32 and tuple(layer.w.shape) == (32, 64) and not layer.w.requires_grad
    x = torch.randn(2, 40, 147)
    with torch.no_grad():
        k, q, v = layer.kqv(x).split(64, dim=-1)
        qp, kp = layer.prm_exp(q), layer.prm_exp(k)
        assert (qp > 0).all() and (kp > 0).all()  # positive random features
        A = qp @ kp.transpose(1, 2)
        A = A / (A.sum(dim=-1, keepdim=True) + layer.epsilon)
        torch.testing.assert_close(layer.single_attn(x), v + layer.proj(A @ v), atol=1e-5, rtol=1e-5)
    # The random features: orthogonal rows of norm sqrt(m), as the official code draws them.
    torch.testing.assert_close(layer.w @ layer.w.T, 32 * torch.eye(32), atol=1e-4, rtol=0)


def test_performer_w_is_saved_but_not_trained() -> None:
    model = vitlab.create_model("t2t_vit_14", **SHORT)
    w = model.tokens_to_token.attention1.w
    assert "tokens_to_token.attention1.w" in model.state_dict()
    model(random_images(1)).sum().backward()
    assert w.grad is None and model.tokens_to_token.attention1.kqv.weight.grad is not None


def test_pos_embed_is_the_fixed_sinusoid_table() -> None:
    model = vitlab.create_model("t2t_vit_t_14", **SHORT)
    D = 384
    pos = torch.arange(197, dtype=torch.float64)[:, None]
    j = torch.arange(D, dtype=torch.float64)
    angles = pos / 10000 ** (2 * (j // 2) / D)  # the official get_sinusoid_encoding's formula
    table = torch.where(j % 2 == 0, angles.sin(), angles.cos()).float()[None]
    torch.testing.assert_close(model.pos_embed, table, atol=1e-6, rtol=0)
    assert not model.pos_embed.requires_grad


# ---------------------------------------------------------------- backbone


def test_backbone_blocks_match_the_official_hyperparameters() -> None:
    model = build_on_meta("t2t_vit_19")
    block = model.blocks[0]
    assert len(model.blocks) == 19
    assert block.attn.qkv.bias is None  # qkv_bias=False
    assert block.mlp.fc1.out_features == 3 * 448  # mlp ratio 3: 1344
    assert block.attn.num_heads == 7 and block.attn.scale == 64**-0.5
    assert all(m.eps == 1e-5 for m in model.modules() if isinstance(m, nn.LayerNorm))


def test_pretrained_scale_is_embed_dim() -> None:
    # book/reference_numbers.md note 4: the official builders use embed_dim**-0.5 when pretrained=True.
    model = build_on_meta("t2t_vit_t_24", qk_scale="embed_dim")
    assert all(b.attn.scale == 512**-0.5 for b in model.blocks)
    assert model.tokens_to_token.attention1.attn.scale == 147**-0.5  # token layers unaffected


@pytest.mark.parametrize("name", ["t2t_vit_t_14", "t2t_vit_14"])
@pytest.mark.parametrize("qk_scale", ["head_dim", "embed_dim"])
def test_fused_and_explicit_attention_agree(name: str, qk_scale: str) -> None:
    model = perturb_(
        vitlab.create_model(name, qk_scale=qk_scale, **SHORT).eval(), std=0.1
    )  # peaked maps, no zero biases
    images = random_images(2)
    tokens = torch.randn(2, 1 + 196, 384)
    outputs = {}
    for fused in (True, False):
        vitlab.set_fused_attention(model, fused)
        with torch.no_grad():
            outputs[fused] = (model(images), model.blocks[0].attn(tokens))
    assert outputs[True][1].abs().amax() > 0.1  # the attention's output is not ~0
    torch.testing.assert_close(outputs[True][1], outputs[False][1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs[True][0], outputs[False][0], atol=1e-4, rtol=0)
    if name == "t2t_vit_t_14":  # the token transformers' attention (one head, 576 -> 64) too
        layer, x = model.tokens_to_token.attention2.attn, torch.randn(2, 49, 576)
        with torch.no_grad():
            layer.fused_attn = True
            fused = layer(x)
            layer.fused_attn = False
            torch.testing.assert_close(fused, layer(x), atol=1e-5, rtol=1e-5)


def test_set_fused_attention_reaches_every_softmax_attention() -> None:
    model = build_on_meta("t2t_vit_t_14")
    switched = [m for m in model.modules() if hasattr(m, "fused_attn")]
    assert len(switched) == 2 + 14  # two token attentions and the backbone's
    vitlab.set_fused_attention(model, False)
    assert not any(m.fused_attn for m in switched)
    # The Performer has no softmax, hence no fused path to switch.
    performer = build_on_meta("t2t_vit_14")
    assert sum(isinstance(m, Attention) for m in performer.modules()) == 14
    assert sum(hasattr(m, "fused_attn") for m in performer.modules()) == 14


def test_forward_output_shape() -> None:
    model = vitlab.create_model("t2t_vit_14", **SHORT).eval()
    with torch.no_grad():
        assert model(random_images(2)).shape == (2, 10)
        assert model.forward_features(random_images(1)).shape == (1, 197, 384)


# ---------------------------------------------------------------- bad input


def test_heads_must_divide_the_width() -> None:
    with pytest.raises(ValueError, match=r"embed dim 384 is not divisible by num_heads 5"):
        T2TViTConfig(num_heads=5)


def test_image_size_must_be_a_multiple_of_16() -> None:
    with pytest.raises(ValueError, match=r"img_size 200 is not a positive multiple of .* total stride 16"):
        vitlab.create_model("t2t_vit_14", img_size=200)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("tokens_type", "convolution", r"tokens_type must be 'performer' or 'transformer', got 'convolution'"),
        ("qk_scale", "dim", r"qk_scale must be 'head_dim' or 'embed_dim', got 'dim'"),
        ("kernel_ratio", 0.01, r"kernel_ratio 0.01 leaves no random features for token_dim 64"),
        ("depth", 0, r"must be positive, got 3, 0, 64"),
    ],
)
def test_bad_config_values(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        T2TViTConfig(**{field: value})


def test_list_models_has_the_t2t_presets() -> None:
    assert set(T2T_TRAINABLE) <= set(vitlab.list_models("t2t_vit"))
