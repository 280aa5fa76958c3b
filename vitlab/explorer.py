"""The book's interactive figures (Vega-Lite): a still PNG that book/_static/vitlab_vega.js
makes live. The attention explorer: pick a layer, a head and a query patch (click, or the
slider's arrow keys) and see that token's row of the map."""

from __future__ import annotations

import base64
import html
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import altair as alt
import torch
from torch import Tensor

from vitlab.contract import AttentionMap
from vitlab.data import load_digits, make_loaders
from vitlab.factory import create_model
from vitlab.family import TINY_CONFIGS, TINY_IMAGE_SIZE
from vitlab.train import TrainConfig, evaluate, fit
from vitlab.utils import seed_everything

SIZE = 150  # px, each panel


class VegaFigure:
    """A Vega-Lite spec that Jupyter and the book show as its still image, the book live."""

    def __init__(self, chart: alt.TopLevelMixin, alt_text: str) -> None:
        self.spec = chart.properties(description=alt_text).to_dict(validate=False)
        self.alt_text = alt_text

    def _repr_mimebundle_(self, **_: Any) -> dict[str, str]:
        import vl_convert

        png = base64.b64encode(vl_convert.vegalite_to_png(self.spec, scale=1.5)).decode()
        data = json.dumps(self.spec, separators=(",", ":")).replace("</", "<\\/")
        return {
            "text/plain": self.alt_text,
            "text/html": f'<div class="vitlab-vega"><img src="data:image/png;base64,{png}" '
            f'alt="{html.escape(self.alt_text)}" style="width:{2 * SIZE + 110}px">'
            f'<script type="application/json">{data}</script></div>',
        }


def map_layers(maps: Sequence[AttentionMap]) -> list[tuple[str, Tensor]]:
    """``(label, map (h, N_q, N_k))`` of image 0 for each layer; a mixing layer gives two."""
    layers = []
    for m in maps:
        if m.unmixed is not None:
            layers.append((f"{m.path} ({m.kind}, before mixing)", m.unmixed[0]))
        layers.append((f"{m.path} ({m.kind}{', after mixing' if m.unmixed is not None else ''})", m.attn[0]))
    return layers


def grid(n: int) -> tuple[int, int]:
    """``(side, extra)``: ``n`` tokens are ``extra`` ones ([cls], ...) then a side x side grid."""
    side = math.isqrt(n)
    return side, n - side * side


def explorer_rows(maps: Sequence[AttentionMap], decimals: int = 3) -> list[dict[str, Any]]:
    """A row per layer ``l``, head ``h`` (-1: the mean, a one-head layer's only row), query ``q``: its
    attention ``v`` over the keys, ``n`` heads, the :func:`grid` of queries ``qs, qe`` and keys ``ks, ke``."""
    rows = []
    for index, (_, a) in enumerate(map_layers(maps)):
        n, nq, nk = a.shape
        heads = {-1: a.float().mean(0)} | ({} if n == 1 else dict(enumerate(a)))
        (qs, qe), (ks, ke) = grid(nq), grid(nk)
        for h, m in heads.items():
            for q, row in enumerate(m.tolist()):
                v = [round(x, decimals) for x in row]
                rows.append({"l": index, "h": h, "q": q, "n": n, "qs": qs, "qe": qe, "ks": ks, "ke": ke, "v": v})
    return rows


def attention_explorer(maps: Sequence[AttentionMap], image: Tensor, alt_text: str) -> VegaFigure:
    """Explorer of ``maps`` (:func:`vitlab.attention_maps` of a batch whose first image is ``image``)."""
    layers = map_layers(maps)
    side = max(grid(a.shape[1])[0] for _, a in layers)  # the finest query grid
    S = image.shape[-1]
    heads = max(a.shape[0] for _, a in layers)
    layer = alt.param(name="layer", value=len(layers) - 1, bind=alt.binding_select(
        options=list(range(len(layers))), labels=[label for label, _ in layers], name="layer "))  # fmt: skip
    head = alt.param(name="head", value=-1, bind=alt.binding_select(
        options=list(range(-1, heads)), labels=["mean", *map(str, range(heads))], name="head "))  # fmt: skip
    patch = alt.selection_point(name="patch", fields=["p"], on="click", clear=False, value=side * side // 2 + side // 2,
        bind=alt.binding_range(min=-1, max=side * side - 1, step=1, name="query patch (-1: [cls]) "))  # fmt: skip
    x = alt.X("x0:Q", scale=alt.Scale(domain=[0, S]), axis=None)
    y = alt.Y("y0:Q", scale=alt.Scale(domain=[0, S], reverse=True), axis=None)
    pixels = [{"x0": j, "x1": j + 1, "y0": i, "y1": i + 1, "g": round(float(g), 2)}
              for i, r in enumerate(image[0].tolist()) for j, g in enumerate(r)]  # fmt: skip
    cell = S / side
    cells = [{"p": i * side + j, "x0": j * cell, "x1": (j + 1) * cell, "y0": i * cell, "y1": (i + 1) * cell}
             for i in range(side) for j in range(side)]  # fmt: skip
    base = alt.Chart(alt.Data(values=pixels)).encode(x=x, x2="x1", y=y, y2="y1")
    img = base.mark_rect().encode(color=alt.Color("g:Q", scale=alt.Scale(scheme="greys"), legend=None))
    picks = alt.Chart(alt.Data(values=cells), name="patches").mark_rect(fill="white", fillOpacity=0.01).encode(
        x=x, x2="x1", y=y, y2="y1", stroke=alt.condition(patch, alt.value("#d62728"), alt.value(None)),
        strokeWidth=alt.value(3)).add_params(patch)  # fmt: skip
    left = (img + picks).properties(width=SIZE, height=SIZE, title="query patch")
    target = (f"datum.qs * datum.qs + datum.qe == 1 ? 0 : patch_p < 0 ? (datum.qe > 0 ? 0 : -1) : datum.qe"
              f" + floor(floor(patch_p / {side}) * datum.qs / {side}) * datum.qs"
              f" + floor((patch_p % {side}) * datum.qs / {side})")  # fmt: skip
    # Patch keys fill the grid; the other keys ([cls], DeiT's distillation token) a strip below.
    xy = {"x0": "datum.kk < 0 ? datum.k * {S} / 4 : datum.c * {S} / datum.ks",
          "x1": "datum.kk < 0 ? (datum.k + 0.9) * {S} / 4 : (datum.c + 1) * {S} / datum.ks",
          "y0": "datum.kk < 0 ? 1.05 * {S} : datum.r * {S} / datum.ks",
          "y1": "datum.kk < 0 ? 1.2 * {S} : (datum.r + 1) * {S} / datum.ks"}  # fmt: skip
    keys = (alt.Chart(alt.Data(values=explorer_rows(maps)), name="keys")
        .transform_filter("datum.l == layer && (datum.h == head || datum.n == 1)")
        .transform_calculate(t=target).transform_filter("datum.q == datum.t")
        .transform_flatten(["v"]).transform_window(k="row_number()")
        .transform_calculate(k="datum.k - 1").transform_calculate(kk="datum.k - datum.ke")
        .transform_calculate(r="floor(datum.kk / datum.ks)", c="datum.kk % datum.ks")
        .transform_calculate(**{name: e.format(S=S) for name, e in xy.items()})
        .mark_rect().encode(x=x, x2="x1", y=alt.Y("y0:Q", scale=alt.Scale(domain=[0, 1.2 * S], reverse=True),
        axis=None), y2="y1", color=alt.Color("v:Q", scale=alt.Scale(scheme="viridis"), title=None,
        legend=alt.Legend(orient="bottom", gradientLength=SIZE - 20)), tooltip=["k:Q", "v:Q"])
        .properties(width=SIZE, height=round(1.2 * SIZE), title="its attention over the keys"))  # fmt: skip
    return VegaFigure(
        alt.hconcat(left, keys)
        .add_params(layer, head)
        .resolve_scale(x="independent", y="independent", color="independent"),
        alt_text,
    )


def trained_tiny(family: str, weights: str, epochs: int = 15, **overrides: Any) -> tuple[Any, Tensor, float]:
    """Chapter 13's tiny ``family`` (config ``overrides``) trained on 32 px digits: the model,
    8 test images and its test accuracy. The weights are read from the file ``weights`` if it
    exists, else trained on one CPU thread (the same on every machine) and saved there in fp16."""
    preset, tiny = TINY_CONFIGS[family]
    splits, threads = load_digits(image_size=TINY_IMAGE_SIZE), torch.get_num_threads()
    seed_everything(0)
    model = create_model(preset, img_size=TINY_IMAGE_SIZE, in_chans=1, num_classes=10, **(tiny | overrides))
    train_loader, test_loader = make_loaders(splits, batch_size=128, seed=0)
    if os.path.exists(weights):
        model.load_state_dict(torch.load(weights, weights_only=True))
    else:
        torch.set_num_threads(1)
        try:
            config = TrainConfig(epochs=epochs, lr=5e-3, warmup_epochs=1, label_smoothing=0.0, progress=False)
            fit(model, train_loader, test_loader, config)
        finally:
            torch.set_num_threads(threads)
        torch.save({k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}, weights)
    return model.eval(), torch.stack([splits.test[i][0] for i in range(8)]), evaluate(model, test_loader)[1]
