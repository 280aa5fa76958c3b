"""Figures of chapters 1-3: image to tokens, attention, and the ViT encoder.

Every number a figure writes comes from the preset's config or from a forward pass of
the model it names (shapes traced with :func:`trace_preset`), never typed by hand.
"""

from __future__ import annotations

import torch

import vitlab
from vitlab.diagrams._style import Diagram, shape_label
from vitlab.diagrams._trace import trace_preset
from vitlab.layers import patchify


def patches_figure(name: str = "vit_tiny_patch16_224") -> Diagram:
    """Chapter 1: an image becomes tokens."""
    cfg = vitlab.get_config(name)
    model, size, shapes = trace_preset(name, ["patch_embed.proj", "patch_embed", "pos_drop"])
    width, grid_h, grid_w = shapes["patch_embed.proj"][1:]
    n_patches = shapes["patch_embed"][1]
    patch_len = patchify(torch.zeros(size), cfg.patch_size).shape[-1]
    tokens = shapes["pos_drop"][1]  # [cls] + patches, position embeddings added
    p = cfg.patch_size

    d = Diagram(f"{name}: from pixels to tokens")
    d.block("img", "image", kind="data")
    d.block("cut", f"cut into a {grid_h} × {grid_w} grid\nof {p} × {p} patches", kind="embed")
    d.arrow("img", "cut", shape_label(size[1:], names="C × H × W"))
    d.block("flat", "flatten each patch\n(raster order)", kind="embed")
    d.arrow("cut", "flat", shape_label((grid_h, grid_w, p, p, cfg.in_chans)))
    d.block("proj", f"linear projection E: {patch_len} → {width}\n= Conv2d {p}×{p}, stride {p}", kind="embed")
    d.arrow("flat", "proj", shape_label((n_patches, patch_len), names="N × P²C"))
    d.block("cls", "prepend the [cls] token", kind="embed")
    d.arrow("proj", "cls", shape_label((n_patches, width), names="N × D"))
    d.block("pos", f"+ position embeddings\n{shape_label((tokens, width))}", kind="embed")
    d.arrow("cls", "pos", shape_label((tokens, width)))
    d.block("enc", "to the encoder", kind="data", after="pos", along=shape_label((tokens, width), names="(1 + N) × D"))
    return d


def attention_figure(name: str = "vit_small_patch16_224") -> Diagram:
    """Chapter 2: the multi-head self-attention of one block of preset ``name``."""
    model, size, shapes = trace_preset(name, ["blocks.0.norm1", "blocks.0.attn.qkv", "blocks.0.attn"])
    tokens, width = shapes["blocks.0.norm1"][1:]
    qkv_width = shapes["blocks.0.attn.qkv"][-1]
    with torch.no_grad():
        attn_map = vitlab.attention_maps(model, torch.zeros(size, device="meta"))[0].attn  # (1, h, N, N)
    heads, n_query, n_key = attn_map.shape[1:]
    head_dim = width // heads

    d = Diagram(f"{name}: multi-head self-attention")
    d.block("x", "tokens x (after LayerNorm)", kind="data")
    d.block("qkv", f"qkv: Linear {width} → {qkv_width}", kind="attention")
    d.arrow("x", "qkv", shape_label((tokens, width), names="N × C"))
    d.block("split", "split (qkv h d) into\nq, k, v of each head", kind="attention")
    d.arrow("qkv", "split", shape_label((tokens, qkv_width)))
    with d.group(f"one head (of {heads}, in parallel)"):
        with d.same_rank():
            d.block("q", "q", kind="data")
            d.block("k", "k", kind="data")
            d.block("v", "v", kind="data")
        d.block("logits", f"q kᵀ / √{head_dim}", kind="attention")
        d.block("softmax", "softmax over the keys", kind="attention")
        d.block("av", "attention map @ v", kind="attention")
    d.arrow("split", "q", shape_label((tokens, head_dim)))
    d.arrow("split", "k", shape_label((tokens, head_dim)))
    d.arrow("split", "v", shape_label((tokens, head_dim)))
    d.arrow("q", "logits")
    d.arrow("k", "logits")
    d.arrow("logits", "softmax", shape_label((n_query, n_key)))
    d.arrow("softmax", "av", shape_label((n_query, n_key), names="map"))
    d.arrow("v", "av")
    d.block("merge", f"concatenate the {heads} heads", kind="attention")
    d.arrow("av", "merge", shape_label((tokens, head_dim)))
    d.block("proj", f"proj: Linear {width} → {width}", kind="attention")
    d.arrow("merge", "proj", shape_label((tokens, heads * head_dim), names="h·d = C"))
    d.block("out", "output", kind="data", after="proj", along=shape_label(shapes["blocks.0.attn"][1:]))
    return d


def encoder_figure(name: str = "vit_tiny_patch16_224") -> Diagram:
    """The whole ViT of preset ``name``; each residual arrow starts where its branch starts."""
    cfg = vitlab.get_config(name)
    model, size, shapes = trace_preset(name, ["patch_embed", "blocks.0", "blocks.0.mlp.fc1", "norm", "head"])
    n_patches, width = shapes["patch_embed"][1:]
    tokens = shapes["blocks.0"][1]
    hidden = shapes["blocks.0.mlp.fc1"][-1]
    p = cfg.patch_size

    d = Diagram(f"{name}: the ViT encoder")
    d.block("img", "image", kind="data")
    d.block("embed", f"patch embedding\nConv2d {p}×{p}, stride {p}", kind="embed")
    d.arrow("img", "embed", shape_label(size[1:]))
    d.block("cls", "prepend [cls]\n+ position embeddings", kind="embed")
    d.arrow("embed", "cls", shape_label((n_patches, width)))
    with d.group(f"encoder block × {cfg.depth}"):
        d.op("x_in", "x")  # the block's input: the residual stream forks here
        d.block("ln1", "LayerNorm", kind="norm")
        heads = f"{cfg.num_heads} heads × {width // cfg.num_heads}"
        d.block("attn", f"multi-head self-attention\n{heads}", kind="attention")
        d.op("add1", "+")
        d.block("ln2", "LayerNorm", kind="norm")
        d.block("mlp", f"MLP {width} → {hidden} → {width}\nGELU", kind="mlp")
        d.op("add2", "+")
    d.arrow("cls", "x_in", shape_label((tokens, width)))
    d.chain("x_in", "ln1", "attn", "add1")
    d.arrow("x_in", "add1", dashed=True, constraint=False)
    d.chain("add1", "ln2", "mlp", "add2")
    d.arrow("add1", "add2", dashed=True, constraint=False)
    d.block("norm", "LayerNorm", kind="norm", after="add2", along=shape_label((tokens, width)))
    d.block("pick", "take the [cls] token", kind="data")
    d.arrow("norm", "pick", shape_label((tokens, width)))  # the final LayerNorm sees every token
    d.block("head", "Linear head", kind="head", after="pick", along=shape_label((width,)))
    d.block("logits", "logits", kind="data", after="head", along=shape_label(shapes["head"][1:]))
    return d
