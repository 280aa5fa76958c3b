"""Figure of chapter 10: LeViT's conv stem, three stages and shrink attention."""

from __future__ import annotations

from typing import Any

import vitlab
from vitlab.diagrams._style import Diagram, shape_label
from vitlab.diagrams._trace import trace_preset


def levit_figure(name: str = "levit_128s") -> Diagram:
    """LeViT preset ``name``: conv stem, three stages of residual attention-with-bias and MLP
    blocks, shrink attention between stages, mean pooling and the two heads. Shapes from a
    traced pass, heads, key and value widths from the model's attention layers.
    """
    cfg = vitlab.get_config(name)
    n_stages = len(cfg.depth)
    names = ["stem", "head"] + [f"stages.{i}" for i in range(n_stages)]
    names += [f"stages.{i}.downsample.attn_downsample" for i in range(1, n_stages)]
    names += [f"stem.conv{i}" for i in range(1, 5)]
    levit, size, shapes = trace_preset(name, names)
    model: Any = levit  # a LeViT: its stages and layers are read below
    stem_widths = [cfg.in_chans] + [shapes[f"stem.conv{i}"][1] for i in range(1, 5)]
    _, width, side, _ = shapes["stem"]

    d = Diagram(f"{name}: conv stem, three stages")
    d.block("img", "image", kind="data")
    conv = model.stem.conv1.conv
    k, s = conv.kernel_size[0], conv.stride[0]
    chain = " → ".join(str(w) for w in stem_widths)
    stem = f"conv stem: 4 × (Conv {k}×{k}, stride {s} + BN)\nHardswish between\n{chain} channels"
    d.block("stem", stem, kind="conv", changed=True)
    d.arrow("img", "stem", shape_label(size[1:]))
    d.block("flat", "flatten: no [cls],\nno position embedding", kind="embed")
    d.arrow("stem", "flat", shape_label((width, side, side)))
    previous = "flat"
    tokens = side * side
    for i in range(n_stages):
        blocks = model.stages[i].blocks
        if i > 0:
            shrink = model.stages[i].downsample.attn_downsample
            new_tokens, new_width = shapes[f"stages.{i}.downsample.attn_downsample"][1:]
            name_ = f"shrink{i}"
            d.block(
                name_,
                f"shrink attention: {shrink.num_heads} heads,\nqueries on every 2nd position:\n"
                f"{tokens} keys → {new_tokens} queries; + MLP",
                kind="attention",
                changed=True,
            )
            d.arrow(previous, name_, shape_label((tokens, width)))
            previous, tokens, width = name_, new_tokens, new_width
        attn = blocks[0].attn
        hidden = blocks[0].mlp.ln1.linear.out_features
        with d.group(f"stage {i + 1} (× {len(blocks)})"):
            a, m = f"attn{i}", f"mlp{i}"
            d.block(
                a,
                f"attention + learned bias\n{attn.num_heads} heads, key {attn.key_dim}, value {attn.val_dim}",
                kind="attention",
                changed=True,
            )
            d.block(m, f"MLP {width} → {hidden} → {width}\n(BN, Hardswish)", kind="mlp")
            d.arrow(a, m)
        side_i = shapes[f"stages.{i}"][1]
        d.arrow(previous, a, shape_label((side_i, width)))
        previous = m
    d.block("pool", "mean over tokens;\nhead + head_dist (BN + Linear),\naveraged", kind="head")
    d.arrow(previous, "pool", shape_label((tokens, width)))
    d.block("logits", "logits", kind="data")
    d.arrow("pool", "logits", shape_label(shapes["head"][1:]))
    return d
