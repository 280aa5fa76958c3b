"""Figure of chapter 11: CvT's three stages, each a conv token embedding and conv-attention blocks."""

from __future__ import annotations

import vitlab
from vitlab.diagrams._style import Diagram, shape_label
from vitlab.diagrams._trace import trace_preset


def cvt_figure(name: str = "cvt_13") -> Diagram:
    """CvT preset ``name``: per stage a conv token embedding and conv-projection blocks."""
    cfg = vitlab.get_config(name)
    n = cfg.num_stages
    names = ["head"]
    for i in range(n):
        names += [f"stages.{i}.patch_embed", f"stages.{i}.blocks.0", f"stages.{i}.blocks.0.attn.conv_proj_k"]
        names += [f"stages.{i}.blocks.0.mlp.fc1"]
    model, size, shapes = trace_preset(name, names)
    q_k = cfg.kernel_qkv

    d = Diagram(f"{name}: convolutions in three stages")
    d.block("img", "image", kind="data")
    previous, arrow = "img", shape_label(size[1:])
    for i in range(n):
        k, s = cfg.patch_size[i], cfg.patch_stride[i]
        n_tokens, width = shapes[f"stages.{i}.patch_embed"][1:]
        tokens = shapes[f"stages.{i}.blocks.0"][1]
        keys = shapes[f"stages.{i}.blocks.0.attn.conv_proj_k"][1] + (tokens - n_tokens)
        hidden = shapes[f"stages.{i}.blocks.0.mlp.fc1"][-1]
        heads = cfg.num_heads[i]
        with d.group(f"stage {i + 1}"):
            e = f"embed{i}"
            label = f"conv token embedding\nConv {k}×{k}, stride {s} + LayerNorm"
            if tokens > n_tokens:
                label += f"\nthen prepend [cls]: {n_tokens} + {tokens - n_tokens} tokens"
            d.block(e, label, kind="embed", changed=True)
            a = f"blocks{i}"
            d.block(a, f"block × {cfg.depth[i]}: conv projection:\ndepthwise {q_k}×{q_k} + BN (k, v stride "
                    f"{cfg.stride_kv}),\nthen Linear q, k, v; {heads} head{'s' if heads > 1 else ''}:\n{tokens} "
                    f"queries, {keys} keys; MLP {width} → {hidden} → {width}", kind="attention", changed=True,
                    after=e, along=shape_label((tokens, width)))  # fmt: skip
        d.arrow(previous, e, arrow)  # outside the group, so the previous block stays outside it
        previous = a
        arrow = shape_label((tokens, width)) if i == n - 1 else "tokens → 2-D map"
    d.block("head", "LayerNorm,\nLinear head on [cls]", kind="head", after=previous, along=arrow)
    d.block("logits", "logits", kind="data", after="head", along=shape_label(shapes["head"][1:]))
    return d
