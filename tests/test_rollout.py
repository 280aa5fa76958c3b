"""vitlab.rollout: attention rollout (Abnar and Zuidema, 2020) on hand-made maps and on every family.

That the rollout leaves the model as it found it (modes, BatchNorm statistics) and runs no
module twice is checked for every family in tests/test_contract.py.
"""

from __future__ import annotations

import pytest
import torch

import vitlab
from vitlab import rollout
from vitlab.attention_maps import attention_maps
from vitlab.contract import AttentionMap
from vitlab.family import FAMILIES, TINY_CONFIGS, TINY_IMAGE_SIZE, tiny_model
from vitlab.layers import collect_attention_maps
from vitlab.rollout import (
    attention_rollout,
    cls_rollout_map,
    compose_class_attention,
    model_rollout,
    rollout_maps,
    rollout_relevance,
    spread_squeezed_keys,
)


def random_maps(depth: int, B: int, h: int, N: int, seed: int = 0) -> list[torch.Tensor]:
    """Softmax-normalised random attention maps, like a model's."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, N, N, generator=g).mul(2).softmax(-1) for _ in range(depth)]


@pytest.mark.parametrize("head_fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("discard_ratio", [0.0, 0.5])
def test_rows_are_distributions(head_fusion: str, discard_ratio: float) -> None:
    rollout = attention_rollout(random_maps(4, 2, 3, 7), head_fusion=head_fusion, discard_ratio=discard_ratio)
    assert rollout.shape == (2, 7, 7)
    assert (rollout >= 0).all()
    torch.testing.assert_close(rollout.sum(-1), torch.ones(2, 7))


def test_identity_maps_give_the_identity() -> None:
    eye = torch.eye(5).expand(2, 3, 5, 5)
    for add_residual in (True, False):
        rollout = attention_rollout([eye, eye, eye], add_residual=add_residual)
        torch.testing.assert_close(rollout, torch.eye(5).expand(2, 5, 5))


def test_two_layers_by_hand() -> None:
    a1 = torch.tensor([[1.0, 0.0], [0.5, 0.5]])  # one head, two tokens
    a2 = torch.tensor([[0.5, 0.5], [0.0, 1.0]])
    # 0.5 A + 0.5 I: [[1, 0], [0.25, 0.75]] and [[0.75, 0.25], [0, 1]]; later block on the left.
    expected = torch.tensor([[0.8125, 0.1875], [0.25, 0.75]])
    rollout = attention_rollout([a1[None, None], a2[None, None]])
    torch.testing.assert_close(rollout[0], expected)
    # Without the residual the raw maps are multiplied: A2 A1.
    torch.testing.assert_close(attention_rollout([a1[None, None], a2[None, None]], add_residual=False)[0], a2 @ a1)


def test_one_layer_is_the_head_mean_with_the_residual() -> None:
    maps = random_maps(1, 2, 4, 6)
    torch.testing.assert_close(attention_rollout(maps), 0.5 * maps[0].mean(1) + 0.5 * torch.eye(6))


def test_head_fusion_and_discard() -> None:
    maps = random_maps(1, 1, 3, 4, seed=1)
    fused = maps[0].amax(1)
    expected = 0.5 * fused + 0.5 * torch.eye(4)
    torch.testing.assert_close(attention_rollout(maps, head_fusion="max"), expected / expected.sum(-1, keepdim=True))
    discarded = attention_rollout(maps, discard_ratio=0.5)  # the 2 smallest of each row's 4 weights go
    off_diagonal = discarded[0][~torch.eye(4, dtype=torch.bool)].view(4, 3)
    assert ((off_diagonal == 0).sum(-1) >= 2).all(), "the diagonal is never discarded"


@pytest.mark.parametrize(
    ("maps", "match"),
    [
        ([], r"non-empty list .* got an empty list"),
        (torch.rand(2, 3, 5, 5), r"non-empty list .* got a tensor of shape \(2, 3, 5, 5\)"),
        ([torch.rand(2, 5, 5)], r"attn_maps\[0\] must have shape \(B, h, N, N\), got \(2, 5, 5\)"),
        ([torch.rand(1, 2, 5, 4)], r"got \(1, 2, 5, 4\)"),
        ([torch.rand(1, 2, 5, 5), torch.rand(1, 2, 6, 6)], r"\(1, 2, 5, 5\); attn_maps\[1\] has \(1, 2, 6, 6\)"),
    ],
)
def test_bad_maps_raise_naming_shapes(maps: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        attention_rollout(maps)


def test_maps_that_are_not_distributions_are_refused() -> None:
    maps = random_maps(2, 1, 2, 4)
    mixed = torch.einsum("gh,bhij->bgij", torch.tensor([[1.5, -0.5], [-0.3, 1.0]]), maps[1])  # talking heads
    with pytest.raises(ValueError, match=r"attn_maps\[1\] is not a distribution over the keys \(row sums from"):
        attention_rollout([maps[0], mixed])
    negative = maps[0].clone()
    negative[0, 0, 0, :2] += torch.tensor([0.5, -0.5])  # rows still sum to 1, one weight below 0
    with pytest.raises(ValueError, match=r"smallest weight -"):
        attention_rollout([negative])
    with pytest.raises(ValueError, match=r"the class-attention map is not a distribution"):
        compose_class_attention(torch.ones(1, 5) / 5, torch.full((1, 2, 1, 5), 0.5), torch.rand(1, 4, 5))


def test_rollout_reads_the_softmax_maps_before_the_mixing() -> None:
    softmax = random_maps(1, 1, 2, 3)[0]
    mixed = AttentionMap(2 * softmax - 0.1, "blocks.0.attn", "mixed", False, softmax)
    plain = AttentionMap(softmax, "blocks.1.attn", "self", True)
    read = rollout_maps([mixed, plain])
    assert [(r.path, r.kind, r.is_distribution) for r in read] == [("blocks.0.attn", "mixed", True)] + [
        ("blocks.1.attn", "self", True)
    ]
    assert read[0].attn is softmax and read[1] is plain
    with pytest.raises(ValueError, match=r"the map of blocks.0.attn \(re-attention\) is not a distribution"):
        rollout_maps([AttentionMap(softmax, "blocks.0.attn", "re-attention", False)])


@pytest.mark.parametrize("family", ["cait", "deepvit"])
def test_mixed_families_roll_out_their_unmixed_softmax_maps(family: str) -> None:
    model = tiny_model(family, in_chans=3).eval()
    images = torch.randn(2, 3, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE, generator=torch.Generator().manual_seed(0))
    records = attention_maps(model, images)
    assert any(not r.is_distribution for r in records)
    with pytest.raises(ValueError, match="is not a distribution"):  # the maps as the model applies them
        attention_rollout([r.attn for r in records if r.kind != "class"])
    relevance = rollout_relevance(model, images)
    assert (relevance.row >= 0).all()
    if family == "deepvit":  # one stage of square maps: the plain rollout of the unmixed maps
        expected = attention_rollout([r.attn for r in rollout_maps(records)])[:, 0]
        torch.testing.assert_close(relevance.row, expected)


def test_bad_options_raise() -> None:
    maps = random_maps(1, 1, 1, 3)
    with pytest.raises(ValueError, match="head_fusion must be 'mean', 'max' or 'min', got 'sum'"):
        attention_rollout(maps, head_fusion="sum")
    with pytest.raises(ValueError, match=r"discard_ratio must be in \[0, 1\), got 1.0"):
        attention_rollout(maps, discard_ratio=1.0)
    with pytest.raises(ValueError, match=r"expected a rollout of shape \(B, 5, 5\) for a 2x2 grid .* got \(1, 4, 4\)"):
        cls_rollout_map(torch.rand(1, 4, 4), (2, 2))


def test_model_rollout_on_a_small_vit() -> None:
    vitlab.seed_everything(0)
    model = vitlab.create_model("vit_tiny_patch16_224", img_size=8, patch_size=2, in_chans=1, num_classes=10,
                                embed_dim=32, depth=3, num_heads=4)  # fmt: skip
    images = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    grid = model_rollout(model, images)
    assert grid.shape == (3, 4, 4)
    with torch.no_grad():
        maps = collect_attention_maps(model.embed(images), model.blocks)
    assert len(maps) == 3 and maps[0].shape == (3, 4, 17, 17)
    torch.testing.assert_close(grid, attention_rollout(maps)[:, 0, 1:].reshape(3, 4, 4))
    assert (grid.sum((-2, -1)) < 1).all()  # the rest of the class token's row is its own weight
    with pytest.raises(TypeError, match="expected a vitlab model"):
        model_rollout(torch.nn.Linear(2, 2), images)


def test_model_rollout_of_a_distilled_deit_skips_both_prefix_tokens() -> None:
    model = vitlab.create_model("deit_tiny_distilled_patch16_224", img_size=8, patch_size=4, in_chans=1,
                                num_classes=10, embed_dim=32, depth=2, num_heads=4)  # fmt: skip
    assert model_rollout(model, torch.zeros(1, 1, 8, 8)).shape == (1, 2, 2)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_model_rollout_on_every_family_via_the_contract(family: str) -> None:
    # Every family's rule (FAMILY.rollout) gives a distribution over the input tokens whose
    # patch part, on the grid, is what model_rollout returns.
    model = tiny_model(family, in_chans=3)
    images = torch.randn(2, 3, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE, generator=torch.Generator().manual_seed(0))
    relevance = rollout_relevance(model, images)
    assert relevance.query == ("mean over the tokens" if family == "levit" else "class token")
    assert relevance.row.ndim == 2 and relevance.row.shape[0] == 2
    assert torch.isfinite(relevance.row).all()
    torch.testing.assert_close(relevance.row.sum(-1), torch.ones(2))
    grid = model_rollout(model, images)
    h, w = relevance.grid_size
    assert grid.shape == (2, h, w) and h == w
    start = relevance.start
    torch.testing.assert_close(grid, relevance.row[:, start : start + h * w].reshape(2, h, w))
    assert ((grid >= 0) & (grid <= 1)).all()


def test_a_model_without_class_token_gets_the_mean_of_all_rows() -> None:
    # LeViT classifies the mean of its tokens: its relevance is the mean row, not token 0's.
    model = vitlab.create_model("levit_128s", img_size=96, embed_dim=(16, 24, 32), key_dim=8, num_heads=(2, 2, 3),
                                depth=(1, 1, 2), num_classes=10)  # fmt: skip
    images = torch.randn(1, 3, 96, 96, generator=torch.Generator().manual_seed(0))
    relevance = rollout_relevance(model, images)
    maps = model.get_attention_maps(images)
    last_stage = maps[-2:]  # 2 blocks of 2x2 tokens
    assert [m.shape[-1] for m in last_stage] == [4, 4] and maps[-3].shape[-2:] == (4, 9)  # shrink 3x3 -> 2x2
    expected = attention_rollout(last_stage).mean(dim=1)
    assert relevance.query == "mean over the tokens" and relevance.grid_size == (2, 2) and relevance.start == 0
    torch.testing.assert_close(relevance.row, expected)
    assert not torch.allclose(expected, attention_rollout(last_stage)[:, 0])


def test_cait_class_attention_composed_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("cait", in_chans=3)  # 2x2 patches
    # One self-attention layer: every patch reads patch 0. With the residual, patch i's row over
    # the input patches is 0.5 e_0 + 0.5 e_i.
    self_attn = torch.zeros(1, 1, 4, 4)
    self_attn[..., 0] = 1.0
    # Class attention 1, two heads: [cls] and [patch 0], mean [0.5, 0.5, 0, 0, 0].
    ca1 = torch.tensor([[1.0, 0, 0, 0, 0], [0, 1.0, 0, 0, 0]]).view(1, 2, 1, 5)
    # c = 0.5 (0.5 [1,0,0,0,0] + 0.5 [0,1,0,0,0]) + 0.5 [1,0,0,0,0] = [0.75, 0.25, 0, 0, 0].
    ca2 = torch.tensor([0, 0, 0.5, 0.5, 0]).view(1, 1, 1, 5)  # patches 1 and 2
    # mixed = 0.5 [0, .5, .5, 0, 0] + 0.5 [0, .5, 0, .5, 0] = [0, .5, .25, .25, 0];
    # c = 0.5 mixed + 0.5 [.75, .25, 0, 0, 0] = [.375, .375, .125, .125, 0].
    records = [
        AttentionMap(self_attn, "blocks.0.attn", "self", True),
        AttentionMap(ca1, "blocks_token_only.0.attn", "class", True),
        AttentionMap(ca2, "blocks_token_only.1.attn", "class", True),
    ]
    monkeypatch.setattr(rollout, "attention_maps", lambda model, x: records)
    relevance = rollout_relevance(model, torch.zeros(1, 3, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE))
    torch.testing.assert_close(relevance.row, torch.tensor([[0.375, 0.375, 0.125, 0.125, 0.0]]))
    torch.testing.assert_close(relevance.grid(), torch.tensor([[[0.375, 0.125], [0.125, 0.0]]]))
    # Without the residual every patch is patch 0: c = [0.5, 0.5, 0, 0, 0], then patches 1 and 2,
    # both patch 0 by now.
    bare = rollout_relevance(model, torch.zeros(1, 3, 32, 32), add_residual=False)
    torch.testing.assert_close(bare.row, torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0]]))


def test_compose_class_attention_checks_the_shape() -> None:
    with pytest.raises(ValueError, match=r"expected a class-attention map of shape \(B, h, 1, 5\) for 4 patches"):
        compose_class_attention(torch.ones(1, 5) / 5, torch.rand(1, 2, 1, 4), torch.rand(1, 4, 5))


def test_squeezed_keys_spread_over_their_cells() -> None:
    # cls + 2x2 queries, cls + 1x1 key: the key's weight splits over the 4 tokens.
    attn = torch.tensor([0.4, 0.6]).expand(1, 1, 5, 2)
    torch.testing.assert_close(spread_squeezed_keys(attn)[0, 0, 0], torch.tensor([0.4, 0.15, 0.15, 0.15, 0.15]))
    # 4x4 queries, 2x2 keys (stride 2), no prefix: key (0, 1) owns tokens (0, 2), (0, 3), (1, 2), (1, 3).
    attn = torch.zeros(1, 1, 16, 4)
    attn[..., 1] = 1.0
    spread = spread_squeezed_keys(attn, num_prefix_tokens=0)[0, 0, 0].view(4, 4)
    expected = torch.zeros(4, 4)
    expected[:2, 2:] = 0.25
    torch.testing.assert_close(spread, expected)
    # CvT-13's first stage at 224 px: 56x56 tokens, keys 28x28; rows keep their sums.
    maps = random_maps(1, 1, 1, 28 * 28)[0][:, :, :1].expand(1, 1, 56 * 56, 28 * 28)
    torch.testing.assert_close(spread_squeezed_keys(maps).sum(-1), torch.ones(1, 1, 56 * 56))


def test_crossvit_rollout_per_branch_over_both_inputs() -> None:
    preset, overrides = TINY_CONFIGS["crossvit"]
    model = vitlab.create_model(preset, img_size=TINY_IMAGE_SIZE, **{**overrides, "num_encoders": 2})
    images = torch.randn(1, 3, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE, generator=torch.Generator().manual_seed(0))
    small, large = (rollout_relevance(model, images, branch=b) for b in (0, 1))
    assert small.row.shape == large.row.shape == (1, 17 + 5)  # [cls_S, 4x4 patches, cls_L, 2x2 patches]
    assert (small.start, small.grid_size, large.start, large.grid_size) == (1, (4, 4), 18, (2, 2))
    for relevance in (small, large):
        torch.testing.assert_close(relevance.row.sum(-1), torch.ones(1))
        assert (relevance.row[:, :17].sum() > 0) and (relevance.row[:, 17:].sum() > 0)  # both branches feed it
    assert model_rollout(model, images, branch=1).shape == (1, 2, 2)
    with pytest.raises(ValueError, match="branch must be 0"):
        model_rollout(model, images, branch=2)
