"""Figure of chapter 8: CrossViT's two branches and their cross-attention fusion."""

from __future__ import annotations

import vitlab
from vitlab.diagrams._style import Diagram, shape_label
from vitlab.diagrams._trace import trace_preset


def crossvit_figure(name: str = "crossvit_tiny_240") -> Diagram:
    """CrossViT preset ``name``: the S and L branches side by side, fused through their cls tokens."""
    cfg = vitlab.get_config(name)
    names = ["patch_embed.0", "patch_embed.1", "blocks.0.blocks.0", "blocks.0.blocks.1", "blocks.0.projs.0",
             "blocks.0.projs.1", "head.0"]  # fmt: skip
    model, size, shapes = trace_preset(name, names)
    patches = [shapes[f"patch_embed.{i}"][1:] for i in range(2)]  # (N, C) per branch
    tokens = [shapes[f"blocks.0.blocks.{i}"][1:] for i in range(2)]  # (1 + N, C)
    projected = [shapes[f"blocks.0.projs.{i}"][-1] for i in range(2)]  # f: width of the other branch
    b = ("s", "l")

    d = Diagram(f"{name}: two branches, fused by cross-attention")
    d.block("img", "image", kind="data")
    with d.same_rank():
        for i, branch in enumerate("SL"):
            img, p = cfg.branch_img_size[i], cfg.patch_size[i]
            resize = f"{img} px" if img == cfg.img_size else f"resized to {img} px"
            d.block(f"embed_{b[i]}", f"{branch}: {resize}\npatch embedding {p}×{p}", kind="embed")
    with d.same_rank():
        for i in range(2):
            d.block(f"cls_{b[i]}", "+ [cls], position\nembeddings", kind="embed")
    for i in range(2):
        d.arrow("img", f"embed_{b[i]}", shape_label(size[1:]) if i == 0 else "")
        d.arrow(f"embed_{b[i]}", f"cls_{b[i]}", shape_label(patches[i]))
    with d.group(f"multi-scale encoder × {cfg.num_encoders} (dashed: patch tokens, not fused)"):
        with d.same_rank():
            for i, branch in enumerate("SL"):
                heads = cfg.num_heads[i]
                d.block(f"blocks_{b[i]}", f"{branch}: ViT block × {cfg.depth[i]}\n{heads} heads × "
                        f"{tokens[i][1] // heads}", kind="attention")  # fmt: skip
        with d.same_rank():
            for i, branch in enumerate("SL"):
                d.block(f"f_{b[i]}", f"f: {tokens[i][1]} → {projected[i]}", kind="mlp", changed=True)
        with d.same_rank():
            for i, branch in enumerate("SL"):
                j = 1 - i
                d.block(f"ca_{b[i]}", f"cross-attention,\n1 query over\n[f(cls), {'SL'[j]} patches]\n"
                        f"map 1 × {tokens[j][0]}", kind="attention", changed=True)  # fmt: skip
        with d.same_rank():
            for i in range(2):
                d.block(f"g_{b[i]}", f"+ residual,\nthen g: {projected[i]} → {tokens[i][1]}",
                        kind="mlp", changed=True)  # fmt: skip
    for i in range(2):
        j = 1 - i
        d.arrow(f"cls_{b[i]}", f"blocks_{b[i]}", shape_label(tokens[i]))
        d.arrow(f"blocks_{b[i]}", f"f_{b[i]}", shape_label((1, tokens[i][1])))
        d.arrow(f"f_{b[i]}", f"ca_{b[i]}", shape_label((1, projected[i])))
        d.arrow(f"blocks_{b[j]}", f"ca_{b[i]}", dashed=True)  # the other branch's patches
        d.arrow(f"ca_{b[i]}", f"g_{b[i]}")
        # the patch tokens skip f, cross-attention and g: only the class token is fused
        d.arrow(f"blocks_{b[i]}", f"g_{b[i]}", dashed=True)
    with d.same_rank():
        for i, branch in enumerate("SL"):
            d.block(f"head_{b[i]}", f"{branch}: LayerNorm →\nhead on [cls]", kind="head")
    for i in range(2):
        d.arrow(f"g_{b[i]}", f"head_{b[i]}", shape_label(tokens[i]))
    d.block("mean", "mean of the\ntwo heads", kind="head")
    d.block("logits", "logits", kind="data")
    for i in range(2):
        d.arrow(f"head_{b[i]}", "mean", shape_label(shapes["head.0"][1:]) if i == 0 else "")
    d.arrow("mean", "logits", shape_label(shapes["head.0"][1:]))
    return d
