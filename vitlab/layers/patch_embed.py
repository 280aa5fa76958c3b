"""Cut an image into P x P patches and project each one to a D-dimensional token.

Two equivalent implementations: a stride-P convolution (timm, the JAX code) and unfold +
linear (the paper); with the same weights they give the same tokens (``tests/test_layers.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from vitlab.layers.attention import check_heads


def to_2tuple(x: int | tuple[int, int]) -> tuple[int, int]:
    return (x, x) if isinstance(x, int) else (int(x[0]), int(x[1]))


def check_image(
    x: Tensor,
    *,
    in_chans: int,
    patch_size: tuple[int, int],
    img_size: tuple[int, int] | None = None,
    fixed_by: str = "the position embeddings",
) -> None:
    """Raise a ``ValueError`` naming expected and actual values if ``x`` does not fit.

    Shape: x (B, C, H, W); ``img_size`` (if given) is the only size accepted, fixed by ``fixed_by``.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"expected images as a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(f"expected images of shape (B, C, H, W), got a {x.ndim}-D tensor {tuple(x.shape)}")
    _, C, H, W = x.shape
    if C != in_chans:
        raise ValueError(f"expected {in_chans} input channels, got {C} (image shape {tuple(x.shape)})")
    if H % patch_size[0] or W % patch_size[1]:
        raise ValueError(f"image size {H}x{W} is not divisible by the patch size {patch_size[0]}x{patch_size[1]}")
    if img_size is not None and (H, W) != tuple(img_size):
        raise ValueError(f"expected image size {img_size[0]}x{img_size[1]} ({fixed_by} are built for it), got {H}x{W}")


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """Cut images into flattened patches in row-major order, pixels ``(p1 p2 c)``: a reshape (pitfall 2).

    Shape: images (B, C, H, W) -> (B, N, P*P*C), N = (H/P)(W/P).
    """
    return rearrange(images, "B C (h p1) (w p2) -> B (h w) (p1 p2 C)", p1=patch_size, p2=patch_size)


def unpatchify(patches: Tensor, patch_size: int, grid_size: tuple[int, int]) -> Tensor:
    """Inverse of :func:`patchify`. Shape: (B, N, P*P*C) -> (B, C, H, W)."""
    gh, gw = grid_size
    return rearrange(patches, "B (h w) (p1 p2 C) -> B C (h p1) (w p2)", h=gh, w=gw, p1=patch_size, p2=patch_size)


class PatchEmbed(nn.Module):
    """Patch embedding as a stride-P convolution (timm's ``patch_embed.proj``).

    ``img_size=None`` accepts any size divisible by P; otherwise only ``img_size`` (for learned
    position embeddings built for that grid).

    Shape: x (B, C, H, W) -> (B, N, D) with N = (H/P)(W/P).
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] | None = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
    ) -> None:
        super().__init__()
        self.patch_size = to_2tuple(patch_size)
        self.img_size = to_2tuple(img_size) if img_size is not None else None
        if self.img_size is not None:
            for s, p in zip(self.img_size, self.patch_size):
                if s % p:
                    raise ValueError(f"image size {self.img_size} is not divisible by patch size {self.patch_size}")
            self.grid_size = (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])
            self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.in_chans = in_chans
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size)

    def forward(self, x: Tensor) -> Tensor:
        check_image(x, in_chans=self.in_chans, patch_size=self.patch_size, img_size=self.img_size)
        x = self.proj(x)  # (B, D, H/P, W/P)
        return rearrange(x, "B D h w -> B (h w) D")


class UnfoldPatchEmbed(nn.Module):
    """Patch embedding as the paper writes it: unfold into patches, then a linear layer.

    ``F.unfold`` orders a patch's pixels ``(c p1 p2)`` like a flattened conv kernel, so
    ``proj.weight == conv.weight.reshape(D, -1)`` gives identical tokens.

    Shape: x (B, C, H, W) -> (B, N, D).
    """

    def __init__(self, patch_size: int | tuple[int, int] = 16, in_chans: int = 3, embed_dim: int = 768) -> None:
        super().__init__()
        self.patch_size = to_2tuple(patch_size)
        self.in_chans = in_chans
        self.proj = nn.Linear(in_chans * self.patch_size[0] * self.patch_size[1], embed_dim)

    @classmethod
    def from_conv(cls, conv_embed: PatchEmbed) -> "UnfoldPatchEmbed":
        """Build an unfold + linear embedding with the weights of a conv embedding."""
        D, C, p1, p2 = conv_embed.proj.weight.shape
        module = cls(patch_size=(p1, p2), in_chans=C, embed_dim=D)
        with torch.no_grad():
            module.proj.weight.copy_(conv_embed.proj.weight.reshape(D, -1))
            if conv_embed.proj.bias is not None:
                module.proj.bias.copy_(conv_embed.proj.bias)
        return module

    def forward(self, x: Tensor) -> Tensor:
        check_image(x, in_chans=self.in_chans, patch_size=self.patch_size)
        patches = F.unfold(x, kernel_size=self.patch_size, stride=self.patch_size)  # (B, C*P*P, N)
        return self.proj(patches.transpose(1, 2))  # (B, N, D)


def check_patch_encoder_config(
    *, img_size: int, patch_size: int, embed_dim: int, num_heads: int, in_chans: int, depth: int
) -> None:
    """Validate the hyperparameters every patch-token encoder shares (ViT, DeiT, CaiT)."""
    if img_size % patch_size:
        raise ValueError(
            f"img_size {img_size} is not divisible by patch_size {patch_size} (expected a multiple of {patch_size})"
        )
    check_heads(embed_dim, num_heads)
    if in_chans <= 0 or depth <= 0:
        raise ValueError(f"in_chans and depth must be positive, got {in_chans} and {depth}")


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Output length of a convolution or unfold: ``floor((size + 2p - k) / s) + 1`` (pitfall 11)."""
    return (size + 2 * padding - kernel) // stride + 1
