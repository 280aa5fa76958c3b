"""Figure of chapter 4: DeiT⚗, a ViT with a distillation token and a second head."""

from __future__ import annotations

import vitlab
from vitlab.diagrams._style import Diagram, shape_label
from vitlab.diagrams._trace import trace_preset


def distilled_figure(name: str = "deit_tiny_distilled_patch16_224") -> Diagram:
    """DeiT⚗ preset ``name``: [cls, dist, patches], ViT blocks and the two heads."""
    cfg = vitlab.get_config(name)
    if not cfg.distilled:
        raise ValueError(f"{name} has no distillation token; pick a *_distilled_* preset")
    model, size, shapes = trace_preset(name, ["patch_embed", "blocks.0", "blocks.0.mlp.fc1", "head", "head_dist"])
    n_patches, width = shapes["patch_embed"][1:]
    tokens = shapes["blocks.0"][1]
    hidden = shapes["blocks.0.mlp.fc1"][-1]
    classes = shapes["head"][-1]
    p = cfg.patch_size

    d = Diagram(f"{name}: DeiT with a distillation token")
    d.block("img", "image", kind="data")
    d.block("embed", f"patch embedding\nConv2d {p}×{p}, stride {p}", kind="embed")
    d.arrow("img", "embed", shape_label(size[1:]))
    d.block("tokens", "[cls, dist, patches]\n+ a position for every token", kind="embed", changed=True)
    d.arrow("embed", "tokens", shape_label((n_patches, width)))
    heads = cfg.num_heads
    with d.group(f"ViT block × {cfg.depth} (unchanged)"):
        d.block("attn", f"LayerNorm, self-attention\n{heads} heads × {width // heads}, +", kind="attention")
        d.block("mlp", f"LayerNorm, MLP\n{width} → {hidden} → {width}, +", kind="mlp")
    d.arrow("tokens", "attn", shape_label((tokens, width)))
    d.arrow("attn", "mlp")
    d.block("norm", "LayerNorm", kind="norm", after="mlp", along=shape_label((tokens, width)))
    with d.same_rank():
        d.block("head", "head\non token 0 [cls]", kind="head")
        d.block("head_dist", "head_dist\non token 1 [dist]", kind="head", changed=True)
    d.arrow("norm", "head", shape_label((width,)))
    d.arrow("norm", "head_dist", shape_label((width,)))
    with d.same_rank():
        d.note("y", f"{classes} logits ← true label")
        d.note("yt", f"{classes} logits ← teacher's label")
    d.arrow("head", "y")
    d.arrow("head_dist", "yt")
    d.block("mean", "test time: mean of the two", kind="data")
    d.arrow("y", "mean", dashed=True)
    d.arrow("yt", "mean", dashed=True)
    return d
