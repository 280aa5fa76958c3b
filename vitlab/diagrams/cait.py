"""Figure of chapter 6: CaiT's two stages, LayerScale and class-attention."""

from __future__ import annotations

import vitlab
from vitlab.diagrams._style import Diagram, shape_label
from vitlab.diagrams._trace import trace_preset


def cait_figure(name: str = "cait_xxs24_224") -> Diagram:
    """CaiT preset ``name``: self-attention over the patches, then class-attention with [cls]."""
    cfg = vitlab.get_config(name)
    names = ["patch_embed", "blocks.0", "blocks.0.mlp.fc1", "blocks_token_only.0", "blocks_token_only.0.mlp.fc1",
             "norm", "head"]  # fmt: skip
    model, size, shapes = trace_preset(name, names)
    n_patches, width = shapes["patch_embed"][1:]
    hidden = shapes["blocks.0.mlp.fc1"][-1]
    hidden_ca = shapes["blocks_token_only.0.mlp.fc1"][-1]
    cls_shape = shapes["blocks_token_only.0"][1:]
    heads, d = cfg.num_heads, width // cfg.num_heads
    eps = f"{cfg.init_values:g}"
    p = cfg.patch_size

    d_ = Diagram(f"{name}: self-attention, then class-attention")
    d_.block("img", "image", kind="data")
    d_.block("embed", f"patch embedding\nConv2d {p}×{p}, stride {p}", kind="embed")
    d_.arrow("img", "embed", shape_label(size[1:]))
    d_.block("pos", "+ position embeddings\n(patches only: no [cls])", kind="embed", changed=True)
    d_.arrow("embed", "pos", shape_label((n_patches, width)))
    with d_.group(f"self-attention stage: block × {cfg.depth}", changed=True):
        d_.block("sa", f"LayerNorm → talking-heads\nattention, {heads} heads × {d}", kind="attention", changed=True)
        d_.block("ls1", f"LayerScale ×γ (γ₀ = {eps}), then +", kind="norm", changed=True)
        d_.block("mlp", f"LayerNorm → MLP\n{width} → {hidden} → {width}", kind="mlp")
        d_.block("ls2", f"LayerScale ×γ (γ₀ = {eps}), then +", kind="norm", changed=True)
    d_.arrow("pos", "sa", shape_label((n_patches, width)))
    d_.chain("sa", "ls1", "mlp", "ls2")
    d_.arrow("pos", "ls1", dashed=True, constraint=False)  # the residual stream
    d_.arrow("ls1", "ls2", dashed=True, constraint=False)
    d_.block("cls", "[cls] token", kind="embed")
    with d_.group(f"class-attention stage: block × {cfg.depth_token_only}", changed=True):
        d_.block("ca", f"class-attention: q from [cls],\nk, v from [cls, patches]\n{heads} heads, "
                 f"map 1 × {1 + n_patches}", kind="attention", changed=True)  # fmt: skip
        d_.block("ls3", "LayerScale, then +", kind="norm", changed=True)
        d_.block("mlp2", f"LayerNorm → MLP on [cls]\n{width} → {hidden_ca} → {width}", kind="mlp")
        d_.block("ls4", "LayerScale, then +", kind="norm", changed=True)
    d_.arrow("ls2", "ca", f"patches {shape_label((n_patches, width))}\n(not updated)")
    d_.arrow("cls", "ca", shape_label(cls_shape))
    d_.arrow("ca", "ls3")
    d_.arrow("ls3", "mlp2", shape_label(cls_shape))
    d_.arrow("mlp2", "ls4")
    d_.arrow("cls", "ls3", dashed=True, constraint=False)  # the residual: [cls] only
    d_.arrow("ls3", "ls4", dashed=True, constraint=False)
    features = shape_label(shapes["norm"][1:])  # [cls, patches] after the final LayerNorm
    d_.block("norm", f"concat [cls, patches], {features}\n→ LayerNorm → Linear head on [cls]", kind="head")
    d_.arrow("ls4", "norm", shape_label(cls_shape))
    d_.block("logits", "logits", kind="data", after="norm", along=shape_label(shapes["head"][1:]))
    return d_
