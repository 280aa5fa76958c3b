"""The book's interactive figures (vitlab.explorer): their data is the model's attention or shapes, and small."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import altair as alt
import pytest
import torch
import vl_convert

import vitlab
from vitlab.data import load_digits, make_loaders
from vitlab.diagrams._trace import trace_shapes
from vitlab.explorer import attention_explorer, explorer_rows, grid, map_layers, shape_stepper, trained_tiny
from vitlab.family import tiny_model
from vitlab.rollout import attention_rollout
from vitlab.train import evaluate

MAX_BYTES = 300_000  # an interactive figure's data, at most
MIME = "application/vnd.vegalite.v5+json"


@pytest.fixture(scope="module")
def cait() -> tuple[list, torch.Tensor]:
    """A tiny CaiT (talking heads, so two maps for some layers; class-attention, one query)."""
    vitlab.seed_everything(0)
    model = tiny_model("cait").eval()
    images = torch.rand(2, 1, 32, 32)
    return vitlab.attention_maps(model, images), images


@pytest.mark.parametrize("n, expected", [(1, (1, 0)), (5, (2, 1)), (16, (4, 0)), (66, (8, 2))])
def test_grid(n: int, expected: tuple[int, int]) -> None:
    assert grid(n) == expected


def test_rows_are_the_maps_of_image_0(cait: tuple[list, torch.Tensor]) -> None:
    maps, _ = cait
    layers = map_layers(maps)
    assert len(layers) == len(maps) + sum(m.unmixed is not None for m in maps)
    assert [label for label, _ in layers[:2]] == [
        "blocks.0.attn · talking heads · before mixing", "blocks.0.attn · talking heads · after mixing"]  # fmt: skip
    rows = explorer_rows(layers)
    for index, (_, a) in enumerate(layers):
        n, nq, nk = a.shape
        for h in range(-1, n if n > 1 else 0):  # a one-head layer: only its "mean"
            expected = a.mean(0) if h == -1 else a[h]
            for q in range(nq):
                (row,) = [r for r in rows if (r["l"], r["h"], r["q"]) == (index, h, q)]
                torch.testing.assert_close(torch.tensor(row["v"]), expected[q], atol=5e-4, rtol=0)
                assert (row["n"], row["qs"], row["qe"], row["ks"], row["ke"]) == (n, *grid(nq), *grid(nk))
    assert len(rows) == sum((a.shape[0] + (a.shape[0] > 1)) * a.shape[1] for _, a in layers)


def test_extra_layers_come_last() -> None:
    """Chapter 3's rollout (chapter 10's bias) is one more entry of the layer menu."""
    vit_maps = vitlab.attention_maps(tiny_model("vit").eval(), torch.rand(2, 1, 32, 32))
    rollout = attention_rollout([m.attn for m in vit_maps])[:1]
    *layers, (label, shown) = map_layers(vit_maps, [("rollout", rollout)])
    assert label == "rollout" and len(layers) == len(vit_maps) and shown is rollout
    rows = explorer_rows([*layers, (label, shown)])
    assert [r["v"] for r in rows if r["l"] == len(layers)] == [
        [round(x, 3) for x in row] for row in rollout[0].tolist()
    ]


def test_spec_is_valid_and_shown_as_vega_lite(cait: tuple[list, torch.Tensor], monkeypatch) -> None:
    maps, images = cait
    figure = attention_explorer(maps, images[0], "a test figure")
    assert figure.spec["description"] == "a test figure"
    alt.HConcatChart.from_dict(figure.spec, validate=True)  # against Vega-Lite's schema
    vl_convert.vegalite_to_vega(figure.spec, vl_version="5.8")  # the v5 it claims (JupyterLab's) compiles it
    assert figure._repr_mimebundle_() == {MIME: figure.spec, "text/plain": "a test figure"}
    monkeypatch.setitem(sys.modules, "google.colab", None)  # Colab draws it from HTML
    assert "vegaEmbed" in figure._repr_mimebundle_()["text/html"]


def test_the_colour_scale_starts_at_zero(cait: tuple[list, torch.Tensor]) -> None:
    """A near-uniform row (CrossViT's fusion: 0.058 to 0.059) must not be stretched over the whole colour range."""
    maps, images = cait
    keys = attention_explorer(maps, images[0], "x").spec["hconcat"][1]
    assert keys["encoding"]["color"]["scale"]["zero"] is True


def test_the_slider_offers_only_the_tokens_a_model_has() -> None:
    """[cls] is -1 where a model has one (DeiT's [dist] -2); LeViT has none, so its slider starts at patch 0."""

    def params(node: object) -> list:
        if isinstance(node, list):
            return [p for item in node for p in params(item)]
        return [*node.get("params", []), *params(list(node.values()))] if isinstance(node, dict) else []

    def slider(family: str) -> dict:
        vitlab.seed_everything(0)
        image = torch.rand(1, 1, 32, 32)
        spec = attention_explorer(vitlab.attention_maps(tiny_model(family).eval(), image), image[0], "x").spec
        return next(p["bind"] for p in params(spec) if p.get("name") == "patch")

    assert (slider("vit")["min"], slider("vit")["name"]) == (-1, "query patch (-1: [cls]) ")
    assert slider("deit")["min"] == -2
    assert (slider("levit")["min"], slider("levit")["name"]) == (0, "query patch ")


@pytest.mark.parametrize("family, overrides, size", [("t2t_vit", {}, 32), ("vit", {"patch_size": 8}, 32),
                                                     ("deepvit", {}, 64), ("levit", {}, 64)])  # fmt: skip
def test_data_is_small(family: str, overrides: dict, size: int) -> None:
    """The book's largest explorers: the most tokens (chapters 2 and 7), the most pixels (64 px, chapters 5 and 10)."""
    vitlab.seed_everything(0)
    model = vitlab.create_model(vitlab.family.TINY_CONFIGS[family][0], img_size=size, in_chans=1,
                                **(vitlab.family.TINY_CONFIGS[family][1] | overrides)).eval()  # fmt: skip
    image = torch.rand(1, 1, size, size)
    spec = attention_explorer(vitlab.attention_maps(model, image), image[0], "x").spec
    assert 20_000 < len(json.dumps(spec).encode()) <= MAX_BYTES


def test_stepper_shows_the_traced_shapes() -> None:
    steps = ["patch_embed", "transformers.0.blocks.0", "transformers.1.pool", "transformers.2.blocks.0", "head"]
    figure = shape_stepper("pit_ti_224", steps, "x")
    alt.LayerChart.from_dict(figure.spec, validate=True)
    model = vitlab.create_model("pit_ti_224")  # real weights, not the meta device the stepper traces on
    traced = trace_shapes(model, (1, 3, 224, 224), steps)
    rows = figure.spec["datasets"]["steps"]
    assert [r["name"] for r in rows] == ["input", *steps]
    assert [r["shape"] for r in rows] == [str((1, 3, 224, 224)), *(str(traced[s]) for s in steps)]
    assert rows[3]["shape"] == "(1, 128, 14, 14)"  # pooling halves the 27 x 27 grid (PiT, Table 1)


def test_trained_tiny_reads_its_measured_accuracy() -> None:
    """The notebook's model, images and accuracy come from the weights file, measured on the test digits."""
    path = Path(__file__).parents[1] / "notebooks" / "data" / "explorer_vit.pt"
    model, images, accuracy = trained_tiny("vit", str(path), patch_size=8)
    splits = load_digits(image_size=32)
    assert accuracy == evaluate(model, make_loaders(splits, batch_size=128, seed=0)[1])[1] > 0.9
    torch.testing.assert_close(images, torch.stack([splits.test[i][0] for i in range(8)]), atol=2e-3, rtol=1e-3)


def test_trained_tiny_trains_and_saves_a_missing_file(tmp_path: Path) -> None:
    """As on Colab, where data/ is missing: train, save in fp16 with the digits and the accuracy, reload."""
    path = tmp_path / "data" / "vit.pt"
    model, images, accuracy = trained_tiny("vit", str(path), epochs=2)
    saved = torch.load(path, weights_only=True)
    assert {v.dtype for v in saved["model"].values()} == {torch.float16} and images.shape == (8, 1, 32, 32)
    splits = load_digits(image_size=32)
    assert accuracy == saved["accuracy"] == evaluate(model, make_loaders(splits, batch_size=128, seed=0)[1])[1]
