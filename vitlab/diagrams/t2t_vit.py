"""Figure of chapter 7: T2T-ViT's tokens-to-token module, three soft splits."""

from __future__ import annotations

import vitlab
from vitlab.diagrams._style import Diagram, shape_label
from vitlab.diagrams._trace import trace_preset

# (kernel, stride, padding) of the three soft splits, read from the model's nn.Unfold layers.
_SPLITS = ("soft_split0", "soft_split1", "soft_split2")


def t2t_figure(name: str = "t2t_vit_14") -> Diagram:
    """T2T-ViT preset ``name``: three soft splits, then the ViT backbone."""
    cfg = vitlab.get_config(name)
    prefix = "tokens_to_token."
    names = [prefix + n for n in (*_SPLITS, "attention1", "attention2", "project")]
    model, size, shapes = trace_preset(name, [*names, "blocks.0", "blocks.0.mlp.fc1", "head"])
    t2t = model.tokens_to_token
    layer = "Performer" if cfg.tokens_type == "performer" else "transformer"

    d = Diagram(f"{name}: tokens-to-token, then a ViT")
    d.block("img", "image", kind="data")
    previous, previous_label = "img", shape_label(size[1:])
    arrows = []  # drawn after the group: an arrow drawn inside it would pull the image in
    with d.group("tokens-to-token module", changed=True):
        for i, split in enumerate(_SPLITS):
            unfold = getattr(t2t, split)
            k, s, p = (unfold.kernel_size, unfold.stride, unfold.padding)
            k, s, p = (v[0] if isinstance(v, tuple) else v for v in (k, s, p))
            width, tokens = shapes[prefix + split][1:]  # nn.Unfold gives (B, C*k*k, L)
            side = round(tokens**0.5)
            d.block(split, f"soft split {i + 1}: unfold {k}×{k}\nstride {s}, padding {p}", kind="embed", changed=True)
            arrows.append((previous, split, previous_label))
            token_label = f"{side}×{side} = {tokens} tokens\n× {width}"
            if i < 2:
                attn = f"attention{i + 1}"
                out_width = shapes[prefix + attn][-1]
                d.block(attn, f"token {layer}, 1 head: {width} → {out_width},\nthen re-structurize into an image",
                        kind="attention", changed=True)  # fmt: skip
                arrows.append((split, attn, token_label))
                previous, previous_label = attn, shape_label((out_width, side, side))
            else:
                d.block("project", f"Linear {width} → {shapes[prefix + 'project'][-1]}", kind="embed")
                arrows.append((split, "project", token_label))
    for tail, head, label in arrows:
        d.arrow(tail, head, label)
    n_patches, dim = shapes[prefix + "project"][1:]
    d.block("cls", "prepend [cls] + fixed\nsinusoidal position table", kind="embed")
    d.arrow("project", "cls", shape_label((n_patches, dim)))
    tokens = shapes["blocks.0"][1]
    hidden = shapes["blocks.0.mlp.fc1"][-1]
    with d.group(f"ViT block × {cfg.depth}"):
        d.block("attn", f"LayerNorm → attention\n{cfg.num_heads} heads × {dim // cfg.num_heads}", kind="attention")
        d.block("mlp", f"LayerNorm → MLP\n{dim} → {hidden} → {dim}", kind="mlp")
    d.arrow("cls", "attn", shape_label((tokens, dim)))
    d.arrow("attn", "mlp")
    d.block("head", "LayerNorm → Linear head\non [cls]", kind="head", after="mlp", along=shape_label((tokens, dim)))
    d.block("logits", "logits", kind="data", after="head", along=shape_label(shapes["head"][1:]))
    return d
