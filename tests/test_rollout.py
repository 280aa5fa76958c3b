"""vitlab.rollout: attention rollout (Abnar and Zuidema, 2020) on hand-made maps and on the models it reads.

That the rollout leaves the model as it found it (modes, BatchNorm statistics) and runs no
module twice is checked in tests/test_contract.py.
"""

from __future__ import annotations

import math

import pytest
import torch

import vitlab
from vitlab.family import FAMILIES, TINY_IMAGE_SIZE, tiny_model
from vitlab.rollout import attention_rollout, cls_rollout_map, model_rollout


def random_maps(depth: int, B: int, h: int, N: int, seed: int = 0) -> list[torch.Tensor]:
    """Softmax-normalised random attention maps, like a model's."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, N, N, generator=g).mul(2).softmax(-1) for _ in range(depth)]


@pytest.mark.parametrize("head_fusion", ["mean", "max"])
def test_rows_are_distributions(head_fusion: str) -> None:
    rollout = attention_rollout(random_maps(4, 2, 3, 7), head_fusion=head_fusion)
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


def test_head_fusion_max() -> None:
    maps = random_maps(1, 1, 3, 4, seed=1)
    fused = maps[0].amax(1)
    expected = 0.5 * fused + 0.5 * torch.eye(4)
    torch.testing.assert_close(attention_rollout(maps, head_fusion="max"), expected / expected.sum(-1, keepdim=True))


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


def test_bad_options_raise() -> None:
    maps = random_maps(1, 1, 1, 3)
    with pytest.raises(ValueError, match="head_fusion must be 'mean' or 'max', got 'sum'"):
        attention_rollout(maps, head_fusion="sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"expected a rollout of shape \(B, 5, 5\) for a 2x2 grid .* got \(1, 4, 4\)"):
        cls_rollout_map(torch.rand(1, 4, 4), (2, 2))


def test_model_rollout_on_a_small_vit() -> None:
    vitlab.seed_everything(0)
    model = vitlab.create_model("vit_tiny_patch16_224", img_size=8, patch_size=2, in_chans=1, num_classes=10,
                                embed_dim=32, depth=3, num_heads=4)  # fmt: skip
    images = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    grid = model_rollout(model, images)
    assert grid.shape == (3, 4, 4)
    maps = []  # each block's map, asked of the block itself (not through vitlab.attention_maps)
    with torch.no_grad():
        x = model.embed(images)
        for block in model.blocks:
            x, attn = block(x, return_attn=True)
            maps.append(attn)
    assert len(maps) == 3 and maps[0].shape == (3, 4, 17, 17)
    torch.testing.assert_close(grid, attention_rollout(maps)[:, 0, 1:].reshape(3, 4, 4))
    assert (grid.sum((-2, -1)) < 1).all()  # the rest of the class token's row is its own weight
    with pytest.raises(ValueError, match="Linear has no attention layer"):
        model_rollout(torch.nn.Linear(2, 2), images)


def test_model_rollout_of_a_distilled_deit_skips_both_prefix_tokens() -> None:
    model = vitlab.create_model("deit_tiny_distilled_patch16_224", img_size=8, patch_size=4, in_chans=1,
                                num_classes=10, embed_dim=32, depth=2, num_heads=4)  # fmt: skip
    assert model_rollout(model, torch.zeros(1, 1, 8, 8)).shape == (1, 2, 2)


# What model_rollout refuses, and why: maps that are not square self-attention maps.
REFUSED = {
    "deepvit": r"kind \['re-attention'\]",  # heads mixed after the softmax: rows are not distributions
    "cait": r"kind \['class', 'mixed'\]",  # class attention (one query) and talking heads
    "crossvit": r"kind \['cross'\]",  # one branch's cls over the other branch's patches
    "cvt": r"last attention maps are not square",  # squeezed keys
}


PREFIX_TOKENS = {"vit": 1, "deit": 2, "t2t_vit": 1, "pit": 1, "levit": 0}  # cls (DeiT's tiny is distilled)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_model_rollout_on_every_family(family: str) -> None:
    model = tiny_model(family, in_chans=3)
    images = torch.randn(2, 3, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE, generator=torch.Generator().manual_seed(0))
    if family in REFUSED:
        with pytest.raises(ValueError, match=REFUSED[family]):
            model_rollout(model, images)
        return
    records = vitlab.attention_maps(model, images)
    last = records[-1].attn.shape
    run = [r.attn for r in records if r.attn.shape == last]  # the last stage (one stage per shape here)
    rollout = attention_rollout(run)
    prefix = PREFIX_TOKENS[family]
    side = math.isqrt(last[-1] - prefix)
    assert side * side == last[-1] - prefix
    row = rollout[:, 0] if prefix else rollout.mean(dim=1)
    grid = model_rollout(model, images)
    torch.testing.assert_close(grid, row[:, prefix:].reshape(2, side, side))
    assert ((grid >= 0) & (grid <= 1)).all()


def test_a_model_without_class_token_gets_the_mean_of_all_rows() -> None:
    # LeViT classifies the mean of its tokens: its relevance is the mean row, not token 0's.
    model = vitlab.create_model("levit_128s", img_size=96, embed_dim=(16, 24, 32), key_dim=8, num_heads=(2, 2, 3),
                                depth=(1, 1, 2), num_classes=10)  # fmt: skip
    images = torch.randn(1, 3, 96, 96, generator=torch.Generator().manual_seed(0))
    maps = [record.attn for record in vitlab.attention_maps(model, images)]
    last_stage = maps[-2:]  # 2 blocks of 2x2 tokens
    assert [m.shape[-1] for m in last_stage] == [4, 4] and maps[-3].shape[-2:] == (4, 9)  # shrink 3x3 -> 2x2
    expected = attention_rollout(last_stage).mean(dim=1)
    torch.testing.assert_close(model_rollout(model, images), expected.reshape(1, 2, 2))
    assert not torch.allclose(expected, attention_rollout(last_stage)[:, 0])
