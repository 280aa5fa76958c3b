"""Shared layers: patch embedding (conv == unfold+linear), attention paths, position embeddings."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from vitlab.attention_maps import attention_maps
from vitlab.layers import (
    Attention,
    Block,
    DropPath,
    Mlp,
    PatchEmbed,
    UnfoldPatchEmbed,
    check_num_classes,
    classifier_head,
    explicit_attention,
    fused_attention,
    patchify,
    sincos_1d_position_embedding,
    sincos_2d_position_embedding,
    unpatchify,
)


def test_patchify_is_a_reshape_of_the_note_example() -> None:
    # Note 004: a 512x512x3 image with P=16 gives 1024 patches of 768 values.
    image = torch.randn(1, 3, 512, 512)
    patches = patchify(image, 16)
    assert patches.shape == (1, 1024, 768)
    assert patches.numel() == image.numel() == 786_432
    torch.testing.assert_close(unpatchify(patches, 16, (32, 32)), image)


def test_patchify_matches_view_permute() -> None:
    x = torch.randn(2, 3, 32, 48)
    P = 8
    B, C, H, W = x.shape
    manual = x.view(B, C, H // P, P, W // P, P).permute(0, 2, 4, 3, 5, 1).reshape(B, -1, P * P * C)
    torch.testing.assert_close(patchify(x, P), manual)


@pytest.mark.parametrize("size", [(32, 32), (32, 48)])
def test_conv_and_unfold_patch_embeddings_agree(size: tuple[int, int]) -> None:
    conv = PatchEmbed(None, patch_size=8, in_chans=3, embed_dim=20)
    unfold = UnfoldPatchEmbed.from_conv(conv)
    x = torch.randn(2, 3, *size)
    torch.testing.assert_close(conv(x), unfold(x), atol=1e-5, rtol=1e-5)
    assert conv(x).shape == (2, size[0] // 8 * size[1] // 8, 20)


def test_unfold_patch_embed_rejects_bad_input() -> None:
    embed = UnfoldPatchEmbed(patch_size=8, in_chans=3, embed_dim=4)
    with pytest.raises(ValueError, match="expected 3 input channels, got 4"):
        embed(torch.randn(1, 4, 16, 16))
    with pytest.raises(ValueError, match="not divisible by the patch size 8x8"):
        embed(torch.randn(1, 3, 20, 16))
    with pytest.raises(TypeError, match="expected images as a torch.Tensor"):
        embed([[1.0]])


@pytest.mark.parametrize("batch, n_q, n_k", [(1, 5, 5), (3, 7, 11)])
def test_explicit_attention_matches_the_formula_and_sdpa(batch: int, n_q: int, n_k: int) -> None:
    q, k, v = torch.randn(batch, 2, n_q, 8), torch.randn(batch, 2, n_k, 8), torch.randn(batch, 2, n_k, 8)
    out, attn = explicit_attention(q, k, v, scale=8**-0.5)
    expected = torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, dim=-1) @ v
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(attn.sum(-1), torch.ones(batch, 2, n_q))
    torch.testing.assert_close(fused_attention(q, k, v, scale=8**-0.5), out, atol=1e-5, rtol=1e-5)


def test_masked_attention_paths_agree_and_fully_masked_rows_are_zero() -> None:
    q = k = v = torch.randn(2, 2, 4, 8)
    mask = torch.tensor([[True, True, False, False]] * 3 + [[False] * 4])  # last query sees nothing
    out, attn = explicit_attention(q, k, v, scale=8**-0.5, mask=mask)
    assert torch.isfinite(out).all()
    assert attn[..., :3, 2:].abs().max() == 0
    torch.testing.assert_close(out[..., 3, :], torch.zeros(2, 2, 8))
    torch.testing.assert_close(fused_attention(q, k, v, scale=8**-0.5, mask=mask), out, atol=1e-5, rtol=1e-5)


def test_attention_module_paths_agree_and_return_maps() -> None:
    attn = Attention(32, num_heads=4).eval()
    x = torch.randn(2, 10, 32)
    fused = attn(x)
    attn.fused_attn = False
    explicit, maps = attn(x, return_attn=True)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)
    assert maps.shape == (2, 4, 10, 10)


def test_qkv_split_is_qkv_h_d_like_timm() -> None:
    # Pitfall 5: the qkv features are ordered (qkv h d); view/permute gives the same split.
    attn = Attention(12, num_heads=3)
    x = torch.randn(2, 5, 12)
    qkv = attn.qkv(x)
    q_einops = rearrange(qkv, "B N (qkv h d) -> qkv B h N d", qkv=3, h=3)[0]
    q_view = qkv.view(2, 5, 3, 3, 4).permute(2, 0, 3, 1, 4)[0]
    torch.testing.assert_close(q_einops, q_view)
    torch.testing.assert_close(
        q_einops, rearrange(x @ attn.qkv.weight[:12].T + attn.qkv.bias[:12], "B N (h d) -> B h N d", h=3)
    )


def test_attention_rejects_bad_head_count() -> None:
    with pytest.raises(ValueError, match="embed dim 10 is not divisible by num_heads 4"):
        Attention(10, num_heads=4)


def test_block_is_the_pre_norm_equation() -> None:
    torch.manual_seed(0)
    block = Block(16, num_heads=2, scale=0.1).eval()
    for p in block.parameters():  # LayerNorm gains and biases away from 1 and 0, so a swapped norm shows
        p.data.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 7, 16)
    y, attn = block(x, return_attn=True)
    assert block.attn.scale == 0.1 and attn.shape == (2, 2, 7, 7)
    mid = x + block.attn(block.norm1(x))  # x + Attn(LN(x))
    torch.testing.assert_close(y, mid + block.mlp(block.norm2(mid)))  # then x + MLP(LN(x))
    assert [name for name, _ in block.named_children()] == ["norm1", "attn", "drop_path1", "norm2", "mlp", "drop_path2"]


def test_mlp_has_one_hidden_layer() -> None:
    mlp = Mlp(8, 32)
    assert [type(m).__name__ for m in mlp.children()] == ["Linear", "GELU", "Dropout", "Linear", "Dropout"]
    assert mlp(torch.randn(3, 8)).shape == (3, 8)


def test_drop_path_keeps_expectation_and_is_identity_in_eval() -> None:
    layer = DropPath(0.25)
    x = torch.ones(20000, 1)
    assert abs(layer.train()(x).mean().item() - 1.0) < 0.03
    torch.testing.assert_close(layer.eval()(x), x)
    with pytest.raises(ValueError, match="drop_prob must be in"):
        DropPath(1.0)


def test_sincos_embeddings() -> None:
    table = sincos_2d_position_embedding((14, 14), 64)
    assert table.shape == (196, 64)
    assert table.abs().max() <= 1.0
    # Neighbouring patches are more alike than distant ones.
    sim = F.cosine_similarity(table[:, None], table[None], dim=-1)
    assert sim[0, 1] > sim[0, 13] and sim[0, 14] > sim[0, 195]
    one_d = sincos_1d_position_embedding(197, 384)
    assert one_d.shape == (197, 384)
    torch.testing.assert_close(one_d[0, 1::2], torch.ones(192))
    with pytest.raises(ValueError, match="divisible by 4"):
        sincos_2d_position_embedding((2, 2), 6)


def test_block_takes_no_attention_module_and_needs_num_heads() -> None:
    # A paper's own attention or LayerScale lives in its own block (models/cait.py, models/deepvit.py).
    with pytest.raises(TypeError, match="attn"):
        Block(16, num_heads=2, attn=Attention(16, num_heads=2))  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="init_values"):
        Block(16, num_heads=2, init_values=1e-5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="num_heads"):
        Block(16)  # type: ignore[call-arg]


def test_classifier_head_and_num_classes_check() -> None:
    assert isinstance(classifier_head(8, 0), torch.nn.Identity)
    assert classifier_head(8, 3).out_features == 3
    with pytest.raises(ValueError, match=r"num_classes must be an int >= 0 \(0 = no head\), got -2"):
        classifier_head(8, -2)
    with pytest.raises(ValueError, match=r"got True"):
        check_num_classes(True)  # type: ignore[arg-type]


def test_attention_maps_collects_each_layer_once_on_the_explicit_path() -> None:
    torch.manual_seed(0)
    blocks = torch.nn.Sequential(Block(16, num_heads=2, attn_drop=0.5), Block(16, num_heads=4)).train()
    x = torch.randn(2, 5, 16)
    records = attention_maps(blocks, x)
    assert [(r.path, r.kind, r.is_distribution, r.unmixed) for r in records] == [
        ("0.attn", "self", True, None),
        ("1.attn", "self", True, None),
    ]
    assert [tuple(r.attn.shape) for r in records] == [(2, 2, 5, 5), (2, 4, 5, 5)]
    assert blocks.training and all(m.training for m in blocks.modules())  # the mode is restored
    with torch.no_grad():
        first = blocks[0].eval()(x)
        _, expected = blocks[1].eval().attn(blocks[1].norm1(first), return_attn=True)
    torch.testing.assert_close(records[1].attn, expected)  # eval mode: attention dropout off
    assert all(r.attn.grad_fn is None for r in records)


def test_attention_maps_needs_an_attention_layer() -> None:
    with pytest.raises(ValueError, match=r"Linear has no attention layer \(no module with an attn_kind\)"):
        attention_maps(torch.nn.Linear(2, 2), torch.randn(1, 2))
