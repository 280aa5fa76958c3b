"""LeViT: timm weight equivalence, the attention bias, the speed paths, the two heads, bad configs.

Checks shared by every family live in tests/test_contract.py.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vitlab
from conftest import assert_same_logits, load_reference, random_images, timm_model
from vitlab.models import levit
from vitlab.models.levit import LeViTAttention, LeViTConfig, attention_bias_index

LEVIT_NAMES = ["levit_128s", "levit_128", "levit_192", "levit_256", "levit_384"]


def randomize(model: nn.Module, inputs: torch.Tensor | None = None, seed: int = 1) -> nn.Module:
    """Random BatchNorm affine parameters and attention biases, then BatchNorm statistics
    measured on random images; returns the model in eval mode.

    At init every residual branch ends in a BN with weight 0, the biases are 0 and the
    running statistics are (0, 1): a wrongly loaded tensor would not show. Untrained
    statistics would also let the tokens collapse to one value by stage 3, which hides
    any mistake in the attention. Statistics measured on ``inputs`` (default: the test
    batch, ``random_images(2)``) keep the activations normalised. The variances are
    floored at 0.1: random images give some features (the pooled ones above all) almost
    no spread, and dividing by that would blow up rounding errors into large logits.
    """
    generator = torch.Generator().manual_seed(seed)
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        for bn in norms:
            bn.weight.copy_(0.5 + torch.rand(bn.weight.shape, generator=generator))
            bn.bias.copy_(0.4 * torch.rand(bn.bias.shape, generator=generator) - 0.2)
            bn.reset_running_stats()
            bn.momentum = None  # running statistics = plain average over the calibration batch
        for name, param in model.named_parameters():
            if name.endswith("attention_biases"):
                param.copy_(torch.randn(param.shape, generator=generator))
        model.train()(random_images(2) if inputs is None else inputs)
        for bn in norms:
            bn.momentum = 0.1
            bn.running_var.clamp_(min=0.1)
    return model.eval()


# All five: 128S/128 have key_dim 16, the others 32, and each has its own head layout.
@pytest.mark.parametrize("name", LEVIT_NAMES)
@pytest.mark.slow
def test_timm_weights_give_same_logits(name: str) -> None:
    reference = randomize(timm_model(name))
    model = load_reference(name, reference)
    images = random_images(2)
    assert_same_logits(model, reference, images)
    with torch.no_grad():
        assert reference(images).abs().max() > 0.1  # the randomized model does not output ~0


def test_convert_timm_renames_three_things() -> None:
    state_dict = timm_model("levit_128s").state_dict()
    converted = vitlab.convert_state_dict("levit_128s", state_dict, "timm")
    assert len(converted) == len(state_dict)
    renamed = {k for k in state_dict if k not in converted}
    assert renamed == {
        k for k in state_dict if (k.startswith("stem.") and ".linear." in k) or ".proj.ln." in k or ".q.ln." in k
    }
    assert "stem.conv1.conv.weight" in converted and "stages.1.downsample.attn_downsample.q.linear.weight" in converted


@pytest.mark.slow
def test_training_returns_both_heads_and_eval_averages_them() -> None:
    reference = randomize(timm_model("levit_128s"))
    model = load_reference("levit_128s", reference)
    images = random_images(2)
    model.train()
    reference.train()
    reference.set_distilled_training(True)
    with torch.no_grad():
        logits, dist_logits = model(images)  # batch statistics in training mode
        ref_logits, ref_dist_logits = reference(images)
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(dist_logits, ref_dist_logits, atol=1e-4, rtol=0)
    model.eval()
    with torch.no_grad():
        pooled = model.forward_features(images).mean(dim=1)
        torch.testing.assert_close(model(images), (model.head(pooled) + model.head_dist(pooled)) / 2)
        assert not torch.allclose(model.head(pooled), model.head_dist(pooled))


@pytest.fixture(params=["default", "flash everywhere"])
def flash_threshold(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused path as shipped, and with SDPA's flash kernel on every map (on CPU it only
    takes maps of CPU_FLASH_MIN_LOGITS or more, and the small test inputs have none)."""
    if request.param == "flash everywhere":
        monkeypatch.setattr(levit, "CPU_FLASH_MIN_LOGITS", 0)


@pytest.mark.usefixtures("flash_threshold")
@pytest.mark.parametrize("name", ["levit_128s", "levit_192"])  # key_dim 16 and 32
@pytest.mark.slow
def test_fused_and_explicit_attention_agree(name: str) -> None:
    # 128 px (8x8 -> 4x4 -> 2x2 maps) keeps it fast; the attention code is the same at 224.
    images = random_images(2, 128)
    model = randomize(vitlab.create_model(name, img_size=128), images)
    with torch.no_grad():
        fused = vitlab.set_fused_attention(model, True)(images)
        explicit = vitlab.set_fused_attention(model, False)(images)
    torch.testing.assert_close(fused, explicit, atol=1e-4, rtol=0)


@pytest.mark.usefixtures("flash_threshold")
@pytest.mark.parametrize("attn_ratio", [0.5, 1, 2, 4])  # values narrower than, as wide as, wider than keys
@pytest.mark.parametrize("stride", [1, 2])
def test_fused_and_explicit_layer_agree_for_any_value_width(attn_ratio: float, stride: int) -> None:
    x = torch.randn(2, 36, 16)
    layer = LeViTAttention(16, 16, key_dim=4, num_heads=2, attn_ratio=attn_ratio, resolution=6, stride=stride)
    randomize(layer, x)
    with torch.no_grad():
        fused = layer(x)
        layer.fused_attn = False
        torch.testing.assert_close(fused, layer(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("value_width", [4, 8, 16])  # values as wide as, 2x, 4x the keys
def test_sdpa_with_the_bias_as_mask_trains_it_like_the_explicit_path(value_width: int) -> None:
    # What the fused path runs on a GPU in training (on CPU a bias with a gradient takes the
    # explicit path, SDPA would use its slower math kernel): the gradients must agree.
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 2, 36, 4, generator=generator)
    v = torch.randn(2, 2, 36, value_width, generator=generator)
    table = torch.randn(2, 36, generator=generator, requires_grad=True)
    index = attention_bias_index(6)
    grads = []
    for attend in (
        lambda bias: F.scaled_dot_product_attention(q, k, v, attn_mask=bias.unsqueeze(0), scale=0.5),
        lambda bias: levit.biased_attention(q, k, v, bias, scale=0.5),
    ):
        table.grad = None
        attend(table[:, index]).square().sum().backward()
        grads.append(table.grad.clone())
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------- the inference cache of the gathered bias
# (a speed path: which SDPA kernel the fused path runs on CPU is checked by benchmarks/levit_kernels.py)


def test_inference_reuses_the_gathered_bias() -> None:
    x = torch.randn(2, 36, 16)
    layer = randomize(LeViTAttention(16, 16, key_dim=4, num_heads=2, attn_ratio=2, resolution=6), x)
    with torch.no_grad():
        first = levit.cached_attention_bias(layer)
        assert levit.cached_attention_bias(layer) is first  # cached: no second gather
        assert layer.attention_bias() is not first  # the readable path gathers every call
        torch.testing.assert_close(first, layer.attention_biases[:, layer.attention_bias_idxs], atol=0, rtol=0)
        layer.attention_biases.add_(1.0)  # any in-place write (an optimizer step, copy_) bumps the version
        torch.testing.assert_close(levit.cached_attention_bias(layer), first + 1.0, atol=0, rtol=0)


def test_load_state_dict_after_an_eval_forward_gives_the_new_models_logits() -> None:
    # timm's cache is keyed on the device only: it would keep the first model's biases here.
    images = random_images(2, 128)
    model = randomize(vitlab.create_model("levit_128s", img_size=128), images, seed=1)
    other = randomize(vitlab.create_model("levit_128s", img_size=128), images, seed=2)
    with torch.no_grad():
        before = model(images)  # fills every layer's cache
        assert all(m._bias_cache is not None for m in model.modules() if isinstance(m, LeViTAttention))
        expected = other(images)
        model.load_state_dict(other.state_dict())
        after = model(images)
    assert not torch.allclose(before, expected, atol=1e-3)
    torch.testing.assert_close(after, expected, atol=0, rtol=0)


def test_training_and_autograd_do_not_use_the_bias_cache() -> None:
    x = torch.randn(2, 36, 16)
    layer = randomize(LeViTAttention(16, 16, key_dim=4, num_heads=2, attn_ratio=2, resolution=6), x)
    with torch.no_grad():
        layer(x)
    assert layer._bias_cache is not None
    # Eval mode with autograd on (fine-tuning with frozen BatchNorm): the gather is in the graph.
    layer(x).square().sum().backward()
    assert layer.attention_biases.grad.abs().max() > 0
    layer._bias_cache = None
    layer.train()
    with torch.no_grad():
        layer(x)
    assert layer._bias_cache is None  # training never fills it
    assert levit.cached_attention_bias(layer).grad_fn is not None


# ---------------------------------------------------------------- the attention bias


def official_style_index(resolution: int, stride: int) -> torch.Tensor:
    """The official numbering, rewritten: offsets get an index in order of first appearance."""
    keys = list(itertools.product(range(resolution), range(resolution)))
    queries = list(itertools.product(range(0, resolution, stride), repeat=2))
    seen: dict[tuple[int, int], int] = {}
    rows = [[seen.setdefault((abs(qy - ky), abs(qx - kx)), len(seen)) for ky, kx in keys] for qy, qx in queries]
    return torch.tensor(rows)


@pytest.mark.parametrize("resolution, stride, shape", [(14, 1, (196, 196)), (14, 2, (49, 196)), (7, 2, (16, 49))])
def test_bias_index_table(resolution: int, stride: int, shape: tuple[int, int]) -> None:
    index = attention_bias_index(resolution, stride)
    assert index.shape == shape
    assert index.dtype == torch.long
    assert index.min() == 0 and index.max() == resolution**2 - 1  # every table entry is used
    torch.testing.assert_close(index, official_style_index(resolution, stride), rtol=0, atol=0)


def test_bias_index_values() -> None:
    index = attention_bias_index(14)
    # query (0, 0) vs key (1, 1) -> offset (1, 1) -> 1 * 14 + 1; key (13, 2) -> 13 * 14 + 2.
    assert index[0, 15] == 15 and index[0, 13 * 14 + 2] == 13 * 14 + 2
    assert (index.diagonal() == 0).all() and torch.equal(index, index.T)
    shrink = attention_bias_index(14, 2)
    # shrink query 1 sits at (0, 2); key (0, 0) is 2 columns away.
    assert shrink[1, 0] == 2 and shrink[8, 0] == 2 * 14 + 2  # query 8 sits at (2, 2)


def test_bias_tables_in_the_model_match_timm() -> None:
    model, reference = vitlab.create_model("levit_128s"), timm_model("levit_128s")
    ours = {k: v for k, v in model.named_buffers() if k.endswith("attention_bias_idxs")}
    theirs = {k.replace(".ln.", "."): v for k, v in reference.named_buffers() if k.endswith("attention_bias_idxs")}
    assert ours.keys() == theirs.keys() and len(ours) == 2 + 3 + 4 + 2
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    assert ours["stages.0.blocks.0.attn.attention_bias_idxs"].shape == (196, 196)
    assert ours["stages.1.downsample.attn_downsample.attention_bias_idxs"].shape == (49, 196)
    assert model.stages[1].downsample.attn_downsample.attention_biases.shape == (8, 196)  # C/D = 128/16 heads


@pytest.mark.parametrize("stride", [1, 2])
def test_bias_is_added_after_scaling(stride: int) -> None:
    # Pitfall 14: softmax(q k^T * D**-0.5 + B), not softmax((q k^T + B) / sqrt(D)), not ... + B / scale.
    D, h, r = 4, 2, 4
    layer = LeViTAttention(8, 8, key_dim=D, num_heads=h, attn_ratio=2, resolution=r, stride=stride)
    x = torch.randn(2, r * r, 8)
    randomize(layer, x)
    with torch.no_grad():
        if stride == 1:
            q, k, v = layer.qkv(x).view(2, r * r, h, -1).transpose(1, 2).split([D, D, 2 * D], dim=-1)
        else:
            k, v = layer.kv(x).view(2, r * r, h, -1).transpose(1, 2).split([D, 2 * D], dim=-1)
            x_q = x.view(2, r, r, 8)[:, ::2, ::2].reshape(2, -1, 8)
            q = layer.q(x_q).view(2, -1, h, D).transpose(1, 2)
        bias = layer.attention_biases[:, layer.attention_bias_idxs]
        assert bias.abs().max() > 0.5

        def output(logits: torch.Tensor) -> torch.Tensor:
            out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(2, -1, h * 2 * D)
            return layer.proj(layer.act(out))

        right = output(q @ k.transpose(-2, -1) / D**0.5 + bias)
        for fused in (True, False):
            layer.fused_attn = fused
            torch.testing.assert_close(layer(x), right, atol=1e-5, rtol=1e-5)
        note = output((q @ k.transpose(-2, -1) + bias) / D**0.5)
        lucidrains = output(q @ k.transpose(-2, -1) * D**-0.5 + bias / D**-0.5)
        assert not torch.allclose(note, right, atol=1e-3) and not torch.allclose(lucidrains, right, atol=1e-3)


def test_biases_start_at_zero() -> None:
    model = vitlab.create_model("levit_128s")
    biases = [p for n, p in model.named_parameters() if n.endswith("attention_biases")]
    assert len(biases) == 11 and all((b == 0).all() for b in biases)


# ---------------------------------------------------------------- shapes


def test_stem_and_stage_shapes() -> None:
    model = vitlab.create_model("levit_128s").eval()
    assert model.config.resolutions == [14, 7, 4]
    x = random_images(1)
    sides = []
    with torch.no_grad():
        for name, layer in model.stem.named_children():
            x = layer(x)
            if name.startswith("conv"):
                sides.append(tuple(x.shape[1:]))
        assert sides == [(16, 112, 112), (32, 56, 56), (64, 28, 28), (128, 14, 14)]
        x = x.flatten(2).transpose(1, 2)
        shapes = []
        for stage in model.stages:
            x = stage(x)
            shapes.append(tuple(x.shape))
    assert shapes == [(1, 196, 128), (1, 49, 256), (1, 16, 384)]


def test_hardswish_everywhere() -> None:
    model = vitlab.create_model("levit_128s")
    assert not any(isinstance(m, (nn.GELU, nn.ReLU)) for m in model.modules())  # Pitfall 15
    assert sum(isinstance(m, nn.Hardswish) for m in model.modules()) == 3 + 2 * (9 + 2)


# ---------------------------------------------------------------- bad input


def test_the_switch_turns_the_bias_cache_off_and_keeps_the_logits() -> None:
    model = randomize(vitlab.create_model("levit_128s", num_classes=10))
    layers = [m for m in model.modules() if isinstance(m, LeViTAttention)]
    images = random_images(2)
    with torch.no_grad():
        fast = model(images)
        assert all(m._bias_cache is not None for m in layers)
        for m in layers:
            torch.testing.assert_close(levit.cached_attention_bias(m), m.attention_bias(), atol=0, rtol=0)
            m._bias_cache = None
        plain = vitlab.set_fused_attention(model, False)(images)
    assert all(m._bias_cache is None for m in layers)  # the readable path never fills the cache
    torch.testing.assert_close(plain, fast, atol=1e-4, rtol=0)


def test_attention_maps_include_shrink_attention() -> None:
    model = vitlab.create_model("levit_128s").eval()
    maps = model.get_attention_maps(random_images(1))
    assert [tuple(m.shape[1:]) for m in maps] == (
        [(4, 196, 196)] * 2 + [(8, 49, 196)] + [(6, 49, 49)] * 3 + [(16, 16, 49)] + [(8, 16, 16)] * 4
    )
    for m in maps:  # softmax rows, the bias included
        torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:-1]))


def test_other_image_size_builds_its_own_tables() -> None:
    model = vitlab.create_model("levit_128s", img_size=128).eval()
    assert model.config.resolutions == [8, 4, 2]
    assert model.stages[0].blocks[0].attn.attention_biases.shape == (4, 64)
    assert model(random_images(1, 128)).shape == (1, 1000)


def test_embed_dim_not_divisible_by_key_dim() -> None:
    # Shrink attention has C / D heads: 200 / 16 is not a whole number of heads.
    with pytest.raises(ValueError, match=r"needs embed_dim\[0\] divisible by key_dim, got 200 and 16"):
        LeViTConfig(embed_dim=(200, 256, 384))


def test_value_dim_must_be_an_integer() -> None:
    with pytest.raises(ValueError, match=r"attn_ratio \* key_dim must be a positive integer, got 2.1 \* 16"):
        LeViTConfig(attn_ratio=2.1)


def test_image_size_not_a_multiple_of_the_stem_stride() -> None:
    with pytest.raises(ValueError, match=r"img_size must be a positive multiple of 16 \(the stem\), got 200"):
        vitlab.create_model("levit_128s", img_size=200)


def test_mismatched_stage_tuples() -> None:
    with pytest.raises(ValueError, match=r"one entry per stage, got lengths 3, 2, 3"):
        LeViTConfig(depth=(2, 3))


def test_non_positive_heads() -> None:
    with pytest.raises(ValueError, match=r"must be positive .* num_heads=\(4, 0, 8\)"):
        LeViTConfig(num_heads=(4, 0, 8))


def test_convert_refuses_a_checkpoint_without_head_dist() -> None:
    state_dict = {k: v for k, v in timm_model("levit_128s").state_dict().items() if not k.startswith("head_dist.")}
    with pytest.raises(ValueError, match=r"config has distilled=True but the state dict has no head_dist"):
        vitlab.convert_state_dict("levit_128s", state_dict, "timm")


def test_list_models_has_the_levit_presets() -> None:
    assert set(LEVIT_NAMES) == set(vitlab.list_models("levit"))
