"""Figure of chapter 9: PiT's three stages and the pooling layers between them."""

from __future__ import annotations

import vitlab
from vitlab.diagrams._style import Diagram, shape_label
from vitlab.diagrams._trace import trace_preset


def pit_figure(name: str = "pit_s_224") -> Diagram:
    """PiT preset ``name``: three stages of ViT blocks with pooling layers between them."""
    cfg = vitlab.get_config(name)
    n_stages = len(cfg.depth)
    names = ["patch_embed", "head"]
    names += [f"transformers.{i}.blocks.0" for i in range(n_stages)]
    names += [f"transformers.{i}.pool" for i in range(1, n_stages)]
    model, size, shapes = trace_preset(name, names)
    _, width, side, _ = shapes["patch_embed"]
    k, s = cfg.patch_size, cfg.patch_stride

    d = Diagram(f"{name}: pooling between three stages")
    d.block("img", "image", kind="data")
    d.block("stem", f"conv stem: Conv2d {k}×{k}, stride {s}\n(overlapping windows)", kind="embed", changed=True)
    d.arrow("img", "stem", shape_label(size[1:]))
    d.block("pos", f"+ spatial position embedding\n{shape_label((width, side, side))}", kind="embed", changed=True)
    d.arrow("stem", "pos", shape_label((width, side, side)))
    d.block("cls", "flatten the grid,\nprepend [cls]", kind="embed", after="pos")
    previous = "cls"
    for i in range(n_stages):
        tokens, dim = shapes[f"transformers.{i}.blocks.0"][1:]
        if i > 0:
            _, out_dim, out_side, _ = shapes[f"transformers.{i}.pool"]
            pool = f"pool{i}"
            d.block(pool, f"pooling: grouped conv 3×3, stride 2\n(groups={width}) {width} → {out_dim} channels;\n"
                    f"[cls]: Linear {width} → {out_dim}", kind="conv", changed=True, after=previous,
                    along=shape_label((side, side)) + " grid")  # fmt: skip
            previous, width, side = pool, out_dim, out_side
        heads = cfg.num_heads[i]
        with d.group(f"stage {i + 1}"):
            block = f"stage{i}"
            label = f"ViT block × {cfg.depth[i]}\n{heads} heads × {dim // heads}\n{side}×{side} grid + [cls]"
            d.block(block, label, kind="attention")
        d.arrow(previous, block, shape_label((tokens, dim)))
        previous = block
    d.block("norm", "LayerNorm,\nLinear head on [cls]", kind="head")
    d.arrow(previous, "norm", shape_label((width,)) + " ([cls])")
    d.block("logits", "logits", kind="data", after="norm", along=shape_label(shapes["head"][1:]))
    return d
