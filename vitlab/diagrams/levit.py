"""Figure of chapter 10: LeViT's conv stem, three stages and shrink attention, and inside a block."""

from __future__ import annotations

from typing import Any

import vitlab
from vitlab.diagrams._style import Diagram, shape_label
from vitlab.diagrams._trace import trace_preset


def _gamma(bn: Any) -> str:
    """The initial BatchNorm weight of a freshly built layer, as the figure writes it."""
    values = bn.weight.unique().tolist()
    if len(values) != 1:
        raise ValueError(f"expected one initial BatchNorm weight, got {values}")
    return f"{values[0]:g}"


def levit_figure(name: str = "levit_128s") -> Diagram:
    """LeViT preset ``name`` (freshly initialised: the BatchNorm weights give the initial values)."""
    cfg = vitlab.get_config(name)
    n_stages = len(cfg.depth)
    names = ["stem", "head"] + [f"stages.{i}" for i in range(n_stages)]
    names += [f"stages.{i}.downsample.attn_downsample" for i in range(1, n_stages)]
    names += [f"stem.conv{i}" for i in range(1, 5)]
    levit, size, shapes = trace_preset(name, names, meta=False)  # real weights: their initial values
    model: Any = levit  # a LeViT: its stages and layers are read below
    stem_widths = [cfg.in_chans] + [shapes[f"stem.conv{i}"][1] for i in range(1, 5)]
    _, width, side, _ = shapes["stem"]

    d = Diagram(f"{name}: conv stem, three stages")
    d.block("img", "image", kind="data")
    conv = model.stem.conv1.conv
    k, s = conv.kernel_size[0], conv.stride[0]
    chain = " → ".join(str(w) for w in stem_widths)
    stem = f"conv stem: 4 × (Conv {k}×{k},\nstride {s} + BN), Hardswish\nbetween: {chain}"
    d.block("stem", stem, kind="conv", changed=True, after="img", along=shape_label(size[1:]))
    d.block("flat", "flatten: no [cls],\nno position embedding", kind="embed")
    d.arrow("stem", "flat", shape_label((width, side, side)))
    previous = "flat"
    tokens = side * side
    for i in range(n_stages):
        blocks = model.stages[i].blocks
        if i > 0:
            shrink = model.stages[i].downsample.attn_downsample
            new_tokens, new_width = shapes[f"stages.{i}.downsample.attn_downsample"][1:]
            hidden = model.stages[i].downsample.mlp.ln1.linear.out_features
            name_ = f"shrink{i}"
            d.block(name_, f"shrink attention: {shrink.num_heads} heads,\nvalue {shrink.val_dim}: {tokens} keys → "
                    f"{new_tokens} queries\n+ MLP {new_width} → {hidden} → {new_width}", kind="attention",
                    changed=True, after=previous, along=shape_label((tokens, width)))  # fmt: skip
            previous, tokens, width = name_, new_tokens, new_width
        attn = blocks[0].attn
        hidden = blocks[0].mlp.ln1.linear.out_features
        stage = f"stage{i}"
        d.block(stage, f"stage {i + 1}: block × {len(blocks)}\n{attn.num_heads} heads, key {attn.key_dim}, value "
                f"{attn.val_dim}\nMLP {width} → {hidden} → {width}", kind="attention", changed=True,
                after=previous, along=shape_label((shapes[f"stages.{i}"][1], width)))  # fmt: skip
        previous = stage
    d.block("pool", "mean over tokens;\nhead + head_dist (BN + Linear),\naveraged", kind="head")
    d.arrow(previous, "pool", shape_label((tokens, width)))
    d.block("logits", "logits", kind="data", after="pool", along=shape_label(shapes["head"][1:]))

    # Right: inside a block and a shrink step, with the initial BatchNorm weights read from the model.
    block = model.stages[0].blocks[0]
    zero_attn, zero_mlp = _gamma(block.attn.proj.bn), _gamma(block.mlp.ln2.bn)
    one = _gamma(model.stages[1].downsample.attn_downsample.proj.bn)
    with d.group("inside a block, at the start"):
        d.note("x", "tokens")
        d.block("b_attn", "attention\n+ learned bias", kind="attention")
        d.block("b_bn1", f"last BN, γ = {zero_attn}", kind="norm", changed=True)
        d.op("b_add1", "+")
        d.block("b_mlp", "MLP, Hardswish", kind="mlp")
        d.block("b_bn2", f"last BN, γ = {zero_mlp}", kind="norm", changed=True)
        d.op("b_add2", "+")
        for tail, head in (("x", "b_attn"), ("b_attn", "b_bn1"), ("b_bn1", "b_add1")):
            d.arrow(tail, head)
        for tail, head in (("b_add1", "b_mlp"), ("b_mlp", "b_bn2"), ("b_bn2", "b_add2")):
            d.arrow(tail, head)
        d.arrow("x", "b_add1", dashed=True)
        d.arrow("b_add1", "b_add2", dashed=True)
    with d.group("a shrink step, at the start"):
        d.block("s_attn", "shrink attention\n(no residual)", kind="attention")
        d.block("s_bn", f"last BN, γ = {one}", kind="norm", changed=True)
        d.block("s_mlp", f"MLP (last BN γ = {zero_mlp})\n+ residual", kind="mlp")
        d.chain("s_attn", "s_bn", "s_mlp")
    d.arrow("b_add2", "s_attn", "end of a stage")
    return d
