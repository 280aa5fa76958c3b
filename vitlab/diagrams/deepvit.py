"""Figure of chapter 5: DeepViT, a ViT whose last blocks use re-attention."""

from __future__ import annotations

import vitlab
from vitlab.diagrams._style import Diagram, shape_label
from vitlab.diagrams._trace import trace_preset
from vitlab.models.deepvit import PatchEmbedCNN


def deepvit_figure(name: str = "deepvit_s") -> Diagram:
    """DeepViT preset ``name``: ViT blocks, then re-attention blocks."""
    cfg = vitlab.get_config(name)
    first_re = cfg.depth - cfg.num_reattention_blocks
    re = f"blocks.{first_re}"
    names = ["patch_embed.conv1", "patch_embed.conv2", "patch_embed.proj", "patch_embed", "blocks.0",
             f"{re}.attn.reatten_matrix", f"{re}.mlp.fc1", "head"]  # fmt: skip
    model, size, shapes = trace_preset(name, names)
    n_patches, width = shapes["patch_embed"][1:]
    tokens = shapes["blocks.0"][1]
    maps = shapes[f"{re}.attn.reatten_matrix"][1:]  # (h, T, T)
    heads = maps[0]
    hidden = shapes[f"{re}.mlp.fc1"][-1]
    stem = model.patch_embed
    if not isinstance(stem, PatchEmbedCNN):
        raise TypeError(f"{name} has no convolutional patch stem")
    k1, s1 = stem.conv1.kernel_size[0], stem.conv1.stride[0]
    k2, k3 = stem.conv2.kernel_size[0], stem.proj.kernel_size[0]

    d = Diagram(f"{name}: DeepViT with re-attention")
    d.block("img", "image", kind="data")
    d.block("stem", f"conv stem: conv {k1}×{k1} stride {s1},\nconv {k2}×{k2}, conv {k3}×{k3} stride {k3}", kind="conv")
    d.arrow("img", "stem", shape_label(size[1:]))
    d.block("cls", "prepend [cls]\n+ position embeddings", kind="embed")
    d.arrow("stem", "cls", shape_label((n_patches, width)))
    d.block("plain", f"ViT block × {first_re}\n{heads} heads × {width // heads}", kind="attention")
    d.arrow("cls", "plain", shape_label((tokens, width)))
    with d.group(f"re-attention block × {cfg.num_reattention_blocks}", changed=True):
        d.block("qk", "LayerNorm, q k, v\nsoftmax(q kᵀ / √d)", kind="attention")
        d.block("mix", f"mix the heads: Θ ({heads} × {heads})", kind="attention", changed=True)
        d.block("bn", f"BatchNorm2d({heads}): each head's map\nstandardised on its own", kind="norm", changed=True)
        d.block("av", "× v, project, +", kind="attention")
        d.block("mlp", f"LayerNorm, MLP\n{width} → {hidden} → {width}, +", kind="mlp")
    d.arrow("plain", "qk", shape_label((tokens, width)))
    d.arrow("qk", "mix", shape_label(maps))
    d.arrow("mix", "bn", shape_label(maps))
    d.arrow("bn", "av", shape_label(maps))
    d.arrow("av", "mlp")
    d.block("norm", "LayerNorm, head on [cls]", kind="head", after="mlp", along=shape_label((tokens, width)))
    d.block("logits", "logits", kind="data", after="norm", along=shape_label(shapes["head"][1:]))
    return d
