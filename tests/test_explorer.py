"""The book's interactive figures (vitlab.explorer): their data is the model's attention, and small."""

from __future__ import annotations

import json

import altair as alt
import pytest
import torch

import vitlab
from vitlab.explorer import attention_explorer, explorer_rows, grid, map_layers
from vitlab.family import tiny_model

MAX_BYTES = 300_000  # an interactive figure's data, at most


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
    rows = explorer_rows(maps)
    for index, (_, a) in enumerate(layers):
        n, nq, nk = a.shape
        for h in range(-1, n):
            expected = a.mean(0) if h == -1 else a[h]
            for q in range(nq):
                (row,) = [r for r in rows if (r["l"], r["h"], r["q"]) == (index, h, q)]
                torch.testing.assert_close(torch.tensor(row["v"]), expected[q], atol=5e-4, rtol=0)
                assert (row["qs"], row["qe"], row["ks"], row["ke"]) == (*grid(nq), *grid(nk))


def test_spec_is_valid(cait: tuple[list, torch.Tensor]) -> None:
    maps, images = cait
    figure = attention_explorer(maps, images[0], "a test figure")
    assert figure.spec["description"] == "a test figure"
    alt.HConcatChart.from_dict(figure.spec, validate=True)  # against Vega-Lite's schema
    html = figure._repr_mimebundle_()["text/html"]
    assert html.startswith('<div class="vitlab-vega"><img src="data:image/png;base64,')


@pytest.mark.parametrize("family, overrides", [("t2t_vit", {}), ("vit", {"patch_size": 8})])
def test_data_is_small(family: str, overrides: dict) -> None:
    """The families with the most tokens in the book's explorers (chapters 2 and 7)."""
    vitlab.seed_everything(0)
    model = vitlab.create_model(vitlab.family.TINY_CONFIGS[family][0], img_size=32, in_chans=1,
                                **(vitlab.family.TINY_CONFIGS[family][1] | overrides)).eval()  # fmt: skip
    image = torch.rand(1, 1, 32, 32)
    spec = attention_explorer(vitlab.attention_maps(model, image), image[0], "x").spec
    assert 20_000 < len(json.dumps(spec).encode()) <= MAX_BYTES
