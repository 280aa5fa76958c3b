"""The model contract (vitlab.contract.VisionModel), checked the same way for every family.

One preset per family, found in the registry (each model file's ``FAMILY``): the contract,
fused == explicit attention, output shapes, a backward pass and the named bad-input errors
on the family's teaching-size model (32 px, fast); parameter counts of every preset against
the recorded reference counts (meta device, no memory); and the weight-conversion round
trip against timm / HuggingFace where the family has a converter. A new family needs a line
in ``REFERENCE_PARAMS`` and nothing else here.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import Tensor, nn

import vitlab
from conftest import assert_same_logits, load_reference, perturb_, random_images, require_reference
from vitlab.contract import VisionModel
from vitlab.family import FAMILIES, TINY_IMAGE_SIZE, attention_token_counts, tiny_model

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
    families = {type(vitlab.get_config(n)).__module__.rsplit(".", 1)[-1] for n in vitlab.list_models()}
    assert families == set(FAMILY_NAMES)
    assert set(REFERENCE_PARAMS) == set(vitlab.list_models())


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


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_attention_maps_one_per_token_mixer_in_forward_order(family: str) -> None:
    model = tiny(family).eval()
    maps = model.get_attention_maps(images())
    counts = attention_token_counts(model, (B, 3, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE))
    assert len(maps) == len(counts) > 0
    for attn, tokens in zip(maps, counts):
        assert attn.ndim == 4 and attn.shape[0] == B  # (B, heads, N_q, N_k)
        assert attn.shape[-2] <= tokens and attn.shape[-1] <= tokens  # queries and keys come from the input


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_fused_and_explicit_attention_agree(family: str) -> None:
    model = tiny(family).eval()
    x = images()
    with torch.no_grad():
        fused = as_tuple(vitlab.set_fused_attention(model, True)(x))
        explicit = as_tuple(vitlab.set_fused_attention(model, False)(x))
    for a, b in zip(fused, explicit):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


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


# ---------------------------------------------------------------- weight conversion round trip


def _reference(name: str, source: str) -> nn.Module:
    """A randomly initialised reference implementation of ``name`` (no download), eval mode,
    every parameter and BatchNorm statistic perturbed so that a wrong mapping shows."""
    torch.manual_seed(0)
    if source == "timm":
        timm = require_reference("timm")
        model = timm.create_model(name, pretrained=False)
    else:  # HuggingFace: CvT is the only family converted from HF
        transformers = require_reference("transformers")
        from vitlab.references import hf_config_fields

        config = transformers.CvtConfig(**hf_config_fields(vitlab.get_config(name)))
        model = transformers.CvtForImageClassification(config)
    return perturb_(model.eval())


def _round_trip_cases() -> list[tuple[str, str]]:
    cases = []
    for family, info in FAMILIES.items():
        module = importlib.import_module(f"vitlab.models.{family}")
        for source in ("timm", "hf"):
            if hasattr(module, f"convert_{source}"):
                cases.append((info.tiny[0], source))
    return cases


@pytest.mark.parametrize("name, source", _round_trip_cases())
def test_reference_weights_round_trip_to_the_same_logits(name: str, source: str) -> None:
    reference = _reference(name, source)
    model = load_reference(name, reference, source)  # strict: every tensor mapped, none left over
    config = vitlab.get_config(name)
    assert_same_logits(model, reference, random_images(1, config.img_size), atol=1e-4)
