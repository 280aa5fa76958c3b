"""The model contract (vitlab.contract.VisionModel), checked the same way for every family.

One preset per family, found in the registry (each model file's ``FAMILY``): the contract,
fused == explicit attention on a model with random non-zero weights, the attention maps of
:func:`vitlab.attention_maps` (one per attention call, labelled, no side effects), output
shapes, a backward pass and the named bad-input errors on the family's teaching-size model
(32 px, fast); parameter counts of every preset against the recorded reference counts, and
every preset's converted reference state dict against the model's, key by key and shape by
shape (both on the meta device: no memory, no time). The reference logits, one small
perturbed run per family, are in each family's own test file. A new family needs a line in
``REFERENCE_PARAMS`` (and, without a reference, nothing else here).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import vitlab
from conftest import random_images, require_reference
from vitlab.attention_maps import attention_layers, attention_maps
from vitlab.contract import MIXED_KINDS, VisionModel
from vitlab.family import FAMILIES, TINY_IMAGE_SIZE, attention_token_counts, family_of, tiny_model
from vitlab.registry import model_class, module_of

FAMILY_NAMES = list(FAMILIES)
B = 2

# Parameter counts of every preset, all parameters (frozen ones included), as recorded from
# the reference implementations: timm for ViT, DeiT, CaiT, CrossViT, PiT and LeViT (with
# head_dist), HF CvtForImageClassification for CvT, the official code for DeepViT and T2T-ViT.
REFERENCE_PARAMS = {
    "vit_tiny_patch16_224": 5_717_416,
    "vit_small_patch16_224": 22_050_664,
    "vit_base_patch16_224": 86_567_656,
    "vit_base_patch32_224": 88_224_232,
    "deit_tiny_patch16_224": 5_717_416,
    "deit_small_patch16_224": 22_050_664,
    "deit_base_patch16_224": 86_567_656,
    "deit_tiny_distilled_patch16_224": 5_910_800,
    "deit_small_distilled_patch16_224": 22_436_432,
    "deit_base_distilled_patch16_224": 87_338_192,
    "deepvit_s": 27_312_632,
    "deepvit_l": 58_883_708,
    "cait_xxs24_224": 11_956_264,
    "cait_xs24_224": 26_560_648,
    "cait_s24_224": 46_916_200,
    "t2t_vit_t_14": 21_541_070,
    "t2t_vit_t_19": 39_172_942,
    "t2t_vit_t_24": 64_101_454,
    "t2t_vit_14": 21_545_550,
    "t2t_vit_19": 39_177_422,
    "t2t_vit_24": 64_105_934,
    "crossvit_tiny_240": 7_014_800,
    "crossvit_small_240": 26_856_272,
    "crossvit_base_240": 105_025_232,
    "crossvit_9_240": 8_553_296,
    "crossvit_15_240": 27_528_464,
    "crossvit_18_240": 43_271_408,
    "crossvit_9_dagger_240": 8_776_592,
    "pit_ti_224": 4_847_272,
    "pit_xs_224": 10_618_888,
    "pit_s_224": 23_461_912,
    "pit_b_224": 73_764_840,
    "levit_128s": 7_777_058,
    "levit_128": 9_213_936,
    "levit_192": 10_947_069,
    "levit_256": 18_893_876,
    "levit_384": 39_128_836,
    "cvt_13": 19_997_480,
    "cvt_21": 31_622_696,
    "cvt_w24_384": 277_196_392,
}


def tiny(family: str) -> nn.Module:
    return tiny_model(family, in_chans=3, num_classes=7)


def images(channels: int = 3, size: int = TINY_IMAGE_SIZE) -> Tensor:
    return random_images(B, size, channels=channels)


def as_tuple(out: Tensor | tuple[Tensor, ...] | list[Tensor]) -> tuple[Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


# ---------------------------------------------------------------- the contract


def test_every_registered_model_has_a_family_and_a_reference_count() -> None:
    families = {family_of(n) for n in vitlab.list_models()}
    assert families == set(FAMILY_NAMES)
    assert set(REFERENCE_PARAMS) == set(vitlab.list_models())


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_forward_reads_beside_its_paper(family: str) -> None:
    # A family's eval forward runs through its own paper file and at most four shared files
    # (patch embedding, attention, MLP, the plain block, drop path): what the paper changes
    # is written in the paper's file, not spread over layers.
    model = tiny(family).eval()
    package = Path(vitlab.__file__).parent
    files: set[str] = set()

    def note(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(str(package)):
            files.add(Path(frame.f_code.co_filename).relative_to(package).as_posix())

    sys.setprofile(note)
    try:
        with torch.no_grad():
            model(images())
    finally:
        sys.setprofile(None)
    own = f"models/{family if family != 'deit' else 'vit'}.py"  # a DeiT is a ViT (deit.py: presets only)
    shared = sorted(files - {own})
    assert own in files, f"{family}'s forward never ran {own}: {sorted(files)}"
    assert all(f.startswith("layers/") for f in shared), f"{family}'s forward leaves its file for {shared}"
    assert len(shared) <= 4, f"{family}'s forward runs through {len(shared)} shared files: {shared}"


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_contract(family: str) -> None:
    model = tiny(family).eval()
    assert isinstance(model, VisionModel)
    x = images()
    with torch.no_grad():
        features = model.forward_features(x)
        logits = model(x)
        torch.testing.assert_close(model.forward_head(features), logits, atol=0, rtol=0)
        pooled = model.forward_head(features, pre_logits=True)
    branches = FAMILIES[family].properties.branches
    tokens = features if branches > 1 else [features]
    assert len(tokens) == branches
    for t in tokens:  # unpooled tokens: (B, N, D)
        assert isinstance(t, Tensor) and t.ndim == 3 and t.shape[0] == B
    assert logits.shape == (B, 7)
    assert pooled.ndim == 2 and pooled.shape[0] == B


def maps_in_call_order(model: nn.Module, x: Tensor) -> list[tuple[str, Tensor]]:
    """Each attention layer's map, in the order ``model(x)`` calls the layers.

    A forward pre-hook on every attention layer keeps each call's inputs, in call order;
    then each call is replayed alone, asking the layer itself for its map
    (``return_attn=True``). Independent of how :func:`vitlab.attention_maps` collects its maps.
    """
    calls: list[tuple[str, nn.Module, tuple[Any, ...], dict[str, Any]]] = []

    def keep_inputs(name: str) -> Callable[..., None]:
        def hook(layer: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            copies = tuple(a.clone() if isinstance(a, Tensor) else a for a in args)  # before any in-place edit
            calls.append((name, layer, copies, dict(kwargs)))

        return hook

    handles = [
        layer.register_forward_pre_hook(keep_inputs(name), with_kwargs=True)
        for layer, name in attention_layers(model).items()
    ]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    with torch.no_grad():
        return [(name, layer(*args, **{**kwargs, "return_attn": True})[1]) for name, layer, args, kwargs in calls]


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_attention_maps_one_per_token_mixer_in_forward_order(family: str) -> None:
    model = vitlab.set_fused_attention(tiny(family).eval(), False)  # the path the maps come from
    x = images()
    maps = [record.attn for record in attention_maps(model, x)]
    called = maps_in_call_order(model, x)
    counts = attention_token_counts(model, (B, 3, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE))
    assert len(maps) == len(called) == len(counts) > 0
    for i, (attn, (name, expected), tokens) in enumerate(zip(maps, called, counts)):
        assert attn.ndim == 4 and attn.shape[0] == B  # (B, heads, N_q, N_k)
        assert attn.shape[-2] <= tokens and attn.shape[-1] <= tokens  # queries and keys come from the input
        # The i-th map is the map of the i-th attention call of the forward pass.
        assert attn.shape == expected.shape, (
            f"map {i} has shape {tuple(attn.shape)}, call {i} ({name}) gives {tuple(expected.shape)}"
        )
        torch.testing.assert_close(attn, expected, msg=f"map {i} is not the map of forward call {i} ({name})")


@torch.no_grad()
def randomise_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter drawn afresh, non-zero and different from its neighbours, and every
    BatchNorm's running statistics made up, in place.

    A fresh model hides differences between the two attention paths: zero biases and
    attention biases, LayerScale at 1e-5 and near-uniform attention make a wrong path
    give (nearly) the right output. Weight matrices get std ``fan_in**-0.5``, so the
    activations stay of order 1; vectors (norms, biases, scales) get std 0.5.
    """
    generator = torch.Generator().manual_seed(seed)
    for param in model.parameters():
        std = param[0].numel() ** -0.5 if param.ndim > 1 else 0.5
        param.copy_(torch.randn(param.shape, generator=generator) * std)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
            module.running_mean.copy_(torch.randn(module.running_mean.shape, generator=generator) * 0.5)
            module.running_var.copy_(0.5 + torch.rand(module.running_var.shape, generator=generator))
    return model


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_fused_and_explicit_attention_agree(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The one speed path of the package is PyTorch's fused kernel: count its calls, so that
    # the test cannot pass by running the explicit path twice.
    calls = Counter[str]()
    kernel = torch.nn.functional.scaled_dot_product_attention

    def counted(*args: Any, **kwargs: Any) -> Tensor:
        calls["fused"] += 1
        return kernel(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    model = randomise_(tiny(family).eval())
    x = images()
    switchable = any(isinstance(getattr(m, "fused_attn", None), bool) for m in model.modules())
    with torch.no_grad():
        fused = as_tuple(vitlab.set_fused_attention(model, True)(x))
        assert calls["fused"] > 0 or not switchable, "fused_attn=True calls F.scaled_dot_product_attention"
        calls.clear()
        explicit = as_tuple(vitlab.set_fused_attention(model, False)(x))
        assert not calls, "set_fused_attention(model, False) leaves no fused call"
    for a, b in zip(fused, explicit, strict=True):
        assert a.std() > 1e-2  # not a constant output, which any two paths would agree on
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- attention maps: labels, one pass, no side effects

KINDS = {
    "vit": {"self"},
    "deit": {"self"},
    "deepvit": {"self", "re-attention"},
    "cait": {"mixed", "class"},
    "t2t_vit": {"self"},
    "crossvit": {"self", "cross"},
    "pit": {"self"},
    "levit": {"self"},
    "cvt": {"self"},
}


def rows_are_distributions(attn: Tensor) -> bool:
    return bool((attn >= 0).all()) and torch.allclose(attn.sum(-1), torch.ones(attn.shape[:-1]), atol=1e-5)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_attention_maps_are_labelled_in_forward_order(family: str) -> None:
    model = tiny(family).eval()
    x = images()
    records = attention_maps(model, x)
    # Each layer runs once, so forward order is module order here.
    assert [r.path for r in records] == list(attention_layers(model).values())
    modules = dict(model.named_modules())
    assert all(getattr(modules[r.path], "attn_kind") == r.kind for r in records)
    assert {r.kind for r in records} == KINDS[family]
    for r in records:
        assert r.is_distribution == (r.kind not in MIXED_KINDS)
        assert rows_are_distributions(r.attn) == r.is_distribution, r.path  # the label is honest
        if r.is_distribution:
            assert r.unmixed is None
        else:  # the heads' softmax maps before the mixing
            assert r.unmixed is not None and r.unmixed.shape == r.attn.shape and rows_are_distributions(r.unmixed)


MAP_METHODS = ("get_attention_maps", "get_class_attention_maps", "get_cross_attention_maps")


def test_attention_maps_have_one_public_way() -> None:
    # vitlab.attention_maps(model, x) is the one way; no model class keeps a second one.
    classes = {model_class(name) for name in vitlab.list_models()}
    extra = sorted(f"{cls.__name__}.{method}" for cls in classes for method in MAP_METHODS if hasattr(cls, method))
    assert not extra, f"use vitlab.attention_maps instead of {extra}"


def module_calls(model: nn.Module, run: Callable[[], object]) -> Counter[str]:
    """How often each module of ``model`` is called while ``run`` runs."""
    calls: Counter[str] = Counter()
    handles = [
        m.register_forward_pre_hook(lambda _m, _args, name=name: calls.update([name]))
        for name, m in model.named_modules()
    ]
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return calls


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_attention_maps_run_no_module_more_often_than_forward(family: str) -> None:
    # The maps come from the explicit path, which also calls the attention-dropout module
    # (in eval mode the identity) whose work the fused kernel does inside: compare with it.
    model = vitlab.set_fused_attention(tiny(family).eval(), False)
    x = images()
    forward = module_calls(model, lambda: model(x))
    calls = module_calls(model, lambda: attention_maps(model, x))
    assert calls.keys() <= forward.keys()
    assert not {name: (n, forward[name]) for name, n in calls.items() if n > forward[name]}


def snapshot(model: nn.Module) -> dict[str, Tensor]:
    """Every parameter and buffer (BatchNorm statistics, non-persistent buffers too), copied."""
    return {name: t.detach().clone() for name, t in [*model.named_parameters(), *model.named_buffers()]}


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_attention_maps_leave_the_model_as_they_found_it(family: str, training: bool) -> None:
    model = tiny(family).train(training)
    list(model.children())[-1].train(not training)  # mixed modes must come back as they were, module by module
    modes = {name: m.training for name, m in model.named_modules()}
    before = snapshot(model)
    x = images()
    attention_maps(model, x)
    assert {name: m.training for name, m in model.named_modules()} == modes
    after = snapshot(model)
    assert not [name for name in before if not torch.equal(before[name], after[name])]
    if training and any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        with torch.no_grad():
            model(x)  # a training pass does update the statistics: the check above can fail
        assert any(not torch.equal(before[name], t) for name, t in snapshot(model).items())


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_backward_reaches_every_trainable_parameter(family: str) -> None:
    model = tiny(family).train()
    loss = sum(out.logsumexp(-1).mean() for out in as_tuple(model(images())))
    assert isinstance(loss, Tensor)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"no gradient reached {missing}"


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_wrong_channel_count_names_expected_and_actual(family: str) -> None:
    with pytest.raises(ValueError, match=r"expected 3 input channels, got 1"):
        tiny(family)(images(channels=1))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_not_a_4d_tensor(family: str) -> None:
    model = tiny(family)
    with pytest.raises(ValueError, match=r"expected images of shape \(B, C, H, W\), got a 3-D tensor"):
        model(torch.zeros(3, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE))
    with pytest.raises(TypeError, match=r"expected images as a torch.Tensor, got list"):
        model([[0.0]])


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_other_image_size_than_configured(family: str) -> None:
    model = tiny(family)
    if family == "cvt":  # no position embedding: any size from min_img_size up
        with pytest.raises(ValueError, match=r"image size 8x8 is too small"):
            model(images(size=8))
        return
    with pytest.raises(ValueError, match=rf"expected image size {TINY_IMAGE_SIZE}x{TINY_IMAGE_SIZE}.*got 48x48"):
        model(images(size=48))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_negative_num_classes(family: str) -> None:
    preset = FAMILIES[family].tiny[0]
    with pytest.raises(ValueError, match=r"num_classes must be an int >= 0 \(0 = no head\), got -1"):
        vitlab.get_config(preset, num_classes=-1)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_no_head_returns_the_pooled_features(family: str) -> None:
    model = tiny_model(family, in_chans=3, num_classes=0).eval()
    x = images()
    with torch.no_grad():
        features = model.forward_features(x)
        torch.testing.assert_close(model(x), model.forward_head(features, pre_logits=True))


# ---------------------------------------------------------------- parameter counts


@pytest.mark.parametrize("name", vitlab.list_models())
def test_parameter_count_matches_the_reference(name: str) -> None:
    with torch.device("meta"):  # shapes only: the 277M-parameter CvT-W24 costs nothing
        model = vitlab.create_model(name)
    assert vitlab.count_parameters(model) == REFERENCE_PARAMS[name]


# ---------------------------------------------------------------- reference state dicts, key by key


# vitlab presets whose reference is built under another name (timm has CaiT-XS24 at 384 px only).
REFERENCE_NAMES: dict[str, tuple[str, dict[str, Any]]] = {"cait_xs24_224": ("cait_xs24_384", {"img_size": 224})}


def _reference_on_meta(name: str, source: str) -> nn.Module:
    """The reference implementation of preset ``name`` on the meta device (shapes, no memory)."""
    with torch.device("meta"):
        if source == "timm":
            timm = require_reference("timm")
            reference_name, overrides = REFERENCE_NAMES.get(name, (name, {}))
            return timm.create_model(reference_name, pretrained=False, **overrides)
        transformers = require_reference("transformers")  # HuggingFace: CvT is the only family converted from HF
        from references import hf_config_fields

        return transformers.CvtForImageClassification(
            transformers.CvtConfig(**hf_config_fields(vitlab.get_config(name)))
        )


def _converted_presets() -> list[tuple[str, str]]:
    return [
        (name, source)
        for name in vitlab.list_models()
        for source in ("timm", "hf")
        if hasattr(module_of(name), f"convert_{source}")
    ]


@pytest.mark.parametrize("name, source", _converted_presets())
def test_reference_state_dict_converts_to_the_same_keys_and_shapes(name: str, source: str) -> None:
    # What each family's own file checks on one small perturbed model (the same logits as the
    # reference), this checks on every preset at full size: every reference tensor lands on a
    # vitlab tensor of the same shape, and every vitlab tensor is filled.
    converted = vitlab.convert_state_dict(name, _reference_on_meta(name, source).state_dict(), source)
    with torch.device("meta"):
        model = vitlab.create_model(name)
    got = {key: tuple(t.shape) for key, t in converted.items()}
    expected = {key: tuple(t.shape) for key, t in model.state_dict().items()}
    assert sorted(got.keys() - expected.keys()) == [], "reference tensors with no place in vitlab"
    assert sorted(expected.keys() - got.keys()) == [], "vitlab tensors the reference does not fill"
    assert {k: (got[k], expected[k]) for k in got if got[k] != expected[k]} == {}
