"""The book's interactive figures (Vega-Lite): the attention explorer and the shape stepper."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import altair as alt
import torch
from torch import Tensor

from vitlab.contract import AttentionMap
from vitlab.data import load_digits, make_loaders
from vitlab.diagrams._trace import trace_preset
from vitlab.factory import create_model
from vitlab.family import TINY_CONFIGS, TINY_IMAGE_SIZE
from vitlab.train import TrainConfig, evaluate, fit
from vitlab.utils import seed_everything

SIZE = 150  # px, each panel
Layer = tuple[str, Tensor]  # (label, map (h, N_q, N_k)) of one image
KINDS = {"self": "self-attention", "class": "class-attention", "cross": "cross-attention", "mixed": "talking heads"}


class VegaFigure:
    """A Vega-Lite spec (its data in ``datasets``), shown live by JupyterLab and the book."""

    def __init__(self, chart: alt.TopLevelMixin, alt_text: str, **datasets: list) -> None:
        self.spec = chart.properties(description=alt_text).to_dict(validate=False) | {"datasets": datasets}
        self.spec["$schema"], self.alt_text = "https://vega.github.io/schema/vega-lite/v5.json", alt_text

    def _repr_mimebundle_(self, **_: Any) -> dict[str, Any]:
        if "google.colab" in sys.modules:  # Colab draws Vega-Lite from HTML (Vega from a CDN)
            return alt.renderers.get()(self.spec)  # type: ignore[return-value]
        return {"application/vnd.vegalite.v5+json": self.spec, "text/plain": self.alt_text}  # v5 features only


def map_layers(maps: Sequence[AttentionMap], extra: Sequence[Layer] = ()) -> list[Layer]:
    """``(label, map (h, N_q, N_k))`` of image 0 per layer (a mixing one: before and after), then the
    ``extra`` ones (e.g. ``("rollout", R[:1])``). The book translates a label's `` · `` parts."""
    pairs = [[(m.attn, [])] if m.unmixed is None else [(m.unmixed, ["before mixing"]), (m.attn, ["after mixing"])]
             for m in maps]  # fmt: skip
    layers = [(" · ".join([m.path, KINDS.get(m.kind, m.kind), *when]), a[0])
              for m, ps in zip(maps, pairs) for a, when in ps]  # fmt: skip
    return layers + list(extra)


def grid(n: int) -> tuple[int, int]:
    """``(side, extra)``: ``n`` tokens are ``extra`` ones ([cls], ...) then a side x side grid."""
    return (side := math.isqrt(n)), n - side * side


def explorer_rows(layers: Sequence[Layer], decimals: int = 3) -> list[dict[str, Any]]:
    """A row per layer ``l``, head ``h`` (-1: the mean, shown for a head the layer lacks), query ``q``: its
    attention ``v`` over the keys, ``n`` heads, the :func:`grid` of queries ``qs, qe`` and keys ``ks, ke``."""
    rows = []
    for index, (_, a) in enumerate(layers):
        (qs, qe), (ks, ke) = map(grid, a.shape[1:])
        for h, m in ({-1: a.float().mean(0)} | ({} if len(a) == 1 else dict(enumerate(a)))).items():
            rows += [{"l": index, "h": h, "q": q, "n": len(a), "qs": qs, "qe": qe, "ks": ks, "ke": ke, "v": v}
                     for q, v in enumerate(((m.double() * 10**decimals).round() / 10**decimals).tolist())]  # fmt: skip
    return rows


def attention_explorer(maps: Sequence[AttentionMap], image: Tensor, alt_text: str,
                       extra: Sequence[Layer] = ()) -> VegaFigure:  # fmt: skip
    """Explorer of ``maps`` (:func:`vitlab.attention_maps` of a batch whose first image is ``image``)."""
    layers = map_layers(maps, extra)
    side, heads, S = max(grid(a.shape[1])[0] for _, a in layers), max(a.shape[0] for _, a in layers), image.shape[-1]
    tokens = ["[cls]", "[dist]"][: max(grid(a.shape[1])[1] for _, a in layers)]  # the patches -1, -2 (LeViT: none)
    layer = alt.param(name="layer", value=len(layers) - 1, bind=alt.binding_select(
        options=list(range(len(layers))), labels=[label for label, _ in layers], name="layer "))  # fmt: skip
    head = alt.param(name="head", value=-1, bind=alt.binding_select(
        options=list(range(-1, heads)), labels=["mean", *map(str, range(heads))], name="head "))  # fmt: skip
    named = f"({', '.join(f'{-1 - i}: {t}' for i, t in enumerate(tokens))}) " if tokens else ""
    patch = alt.selection_point(name="patch", fields=["p"], on="click", clear=False, value=side * side // 2 + side // 2,
        bind=alt.binding_range(min=-len(tokens), max=side * side - 1, step=1, name=f"query patch {named}"))  # fmt: skip
    x = alt.X("x0:Q", scale=alt.Scale(domain=[0, S]), axis=None)
    y = alt.Y("y0:Q", scale=alt.Scale(domain=[0, S], reverse=True), axis=None)
    pixels = [{"x0": j, "x1": j + 1, "y0": i, "y1": i + 1, "g": round(float(g), 2)}
              for i, r in enumerate(image[0].tolist()) for j, g in enumerate(r)]  # fmt: skip
    c = S / side
    cells = [{"p": i * side + j, "x0": j * c, "x1": (j + 1) * c, "y0": i * c, "y1": (i + 1) * c}
             for i in range(side) for j in range(side)]  # fmt: skip
    img = alt.Chart(alt.NamedData("pixels")).mark_rect().encode(x=x, x2="x1", y=y, y2="y1",
        color=alt.Color("g:Q", scale=alt.Scale(scheme="greys"), legend=None))  # fmt: skip
    picks = alt.Chart(alt.NamedData("cells"), name="patches").mark_rect(fill="white", fillOpacity=0.01).encode(
        x=x, x2="x1", y=y, y2="y1", stroke=alt.condition(patch, alt.value("#d62728"), alt.value(None)),
        strokeWidth=alt.value(3)).add_params(patch)  # fmt: skip
    target = (f"datum.qs * datum.qs + datum.qe == 1 ? 0 : patch_p < 0 ? (-patch_p <= datum.qe ? -patch_p - 1 : -1)"
              f" : datum.qe"
              f" + floor(floor(patch_p / {side}) * datum.qs / {side}) * datum.qs"
              f" + floor((patch_p % {side}) * datum.qs / {side})")  # fmt: skip
    # Patch keys fill the grid; the other keys ([cls], DeiT's distillation token) a strip below.
    xy = {"x0": "datum.kk < 0 ? datum.k * {S} / 4 : datum.c * {S} / datum.ks",
          "x1": "datum.kk < 0 ? (datum.k + 0.9) * {S} / 4 : (datum.c + 1) * {S} / datum.ks",
          "y0": "datum.kk < 0 ? 1.05 * {S} : datum.r * {S} / datum.ks",
          "y1": "datum.kk < 0 ? 1.2 * {S} : (datum.r + 1) * {S} / datum.ks"}  # fmt: skip
    # The colour scale starts at 0: a near-uniform row looks uniform, not stretched over 0.058 to 0.059.
    keys = (alt.Chart(alt.NamedData("rows"), name="keys")
        .transform_filter("datum.l == layer && datum.h == (head < datum.n && datum.n > 1 ? head : -1)")
        .transform_calculate(t=target).transform_filter("datum.q == datum.t")
        .transform_flatten(["v"]).transform_window(k="row_number()")
        .transform_calculate(k="datum.k - 1").transform_calculate(kk="datum.k - datum.ke")
        .transform_calculate(r="floor(datum.kk / datum.ks)", c="datum.kk % datum.ks")
        .transform_calculate(**{name: e.format(S=S) for name, e in xy.items()})
        .mark_rect().encode(x=x, x2="x1", y=alt.Y("y0:Q", scale=alt.Scale(domain=[0, 1.2 * S], reverse=True),
        axis=None), y2="y1", color=alt.Color("v:Q", scale=alt.Scale(scheme="viridis", zero=True), title=None,
        legend=alt.Legend(orient="bottom", gradientLength=SIZE - 20)), tooltip=["k:Q", "v:Q"])
        .properties(width=SIZE, height=round(1.2 * SIZE), title="its attention over the keys"))  # fmt: skip
    chart = alt.hconcat((img + picks).properties(width=SIZE, height=SIZE, title="query patch"), keys).add_params(
        layer, head).resolve_scale(x="independent", y="independent", color="independent")  # fmt: skip
    return VegaFigure(chart, alt_text, pixels=pixels, cells=cells, rows=explorer_rows(layers))


def shape_stepper(preset: str, steps: Sequence[str], alt_text: str) -> VegaFigure:
    """Step (slider, arrow keys, click) through ``preset``'s submodules ``steps``: their traced output shapes."""
    _, size, traced = trace_preset(preset, steps)
    rows = [{"i": i, "name": n, "shape": str(({"input": size} | traced)[n])} for i, n in enumerate(["input", *steps])]
    step = alt.selection_point(name="step", fields=["i"], on="click", clear=False, value=0,
        bind=alt.binding_range(min=0, max=len(steps), step=1, name="step "))  # fmt: skip
    base = alt.Chart(alt.NamedData("steps")).encode(y=alt.Y("i:O", axis=None))
    fill = alt.condition(step, alt.value("#fde0c5"), alt.value("#eee"))
    row = base.mark_rect(height=20, x=0, x2=400).encode(color=fill)
    here = base.mark_text(x=4, align="left").encode(text=alt.condition(step, alt.value("▶"), alt.value("")))
    name = base.mark_text(x=20, align="left", font="monospace").encode(text="name:N")
    shape = base.mark_text(x=392, align="right", font="monospace").encode(text="shape:N")
    chart = (row.add_params(step) + here + name + shape).properties(width=400, height=24 * len(rows))
    return VegaFigure(chart, alt_text, steps=rows)


def trained_tiny(
    family: str, weights: str, epochs: int = 15, image_size: int = TINY_IMAGE_SIZE, **overrides: Any
) -> tuple[Any, Tensor, float]:
    """Chapter 13's tiny ``family`` on digits of ``image_size`` px, 8 test digits and its accuracy:
    from ``weights``, else trained. A stem of stride 16 leaves 2 x 2 tokens of 32 px, 4 x 4 of 64 px."""
    preset, tiny = TINY_CONFIGS[family]
    seed_everything(0)
    model = create_model(preset, img_size=image_size, in_chans=1, num_classes=10, **(tiny | overrides))
    if not os.path.exists(weights):
        splits, threads = load_digits(image_size=image_size), torch.get_num_threads()
        train_loader, test_loader = make_loaders(splits, batch_size=128, seed=0)
        torch.set_num_threads(1)
        try:
            fit(model, train_loader, test_loader, TrainConfig(epochs=epochs, lr=5e-3, warmup_epochs=1,
                label_smoothing=0.0, progress=False))  # fmt: skip
        finally:
            torch.set_num_threads(threads)
        half = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
        model.load_state_dict(half)  # measured as stored, in fp16
        images = torch.stack([splits.test[i][0] for i in range(8)]).half()  # (8, 1, image_size, image_size)
        os.makedirs(os.path.dirname(weights) or ".", exist_ok=True)  # Colab has no data/ folder
        torch.save({"model": half, "images": images, "accuracy": evaluate(model, test_loader)[1]}, weights)
    saved = torch.load(weights, weights_only=True)
    model.load_state_dict(saved["model"])
    return model.eval(), saved["images"].float(), saved["accuracy"]
