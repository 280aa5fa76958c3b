"""Knowledge distillation for DeiT (Touvron et al., 2021; Hinton et al., 2015).

The losses follow the official ``facebookresearch/deit`` ``losses.py``:

* soft: ``(1-α)·CE(cls, y) + α·τ²·KL(softmax(teacher/τ) ‖ softmax(dist/τ))``,
* hard: ``(1-α)·CE(cls, y) + α·CE(dist, argmax(teacher))``,

where ``cls`` are the logits of the class-token head and ``dist`` those of the
distillation-token head (``head_dist``). The teacher supervises the *distillation*
head; the class head only ever sees the true labels (pitfall 9).

The course's teacher convnet is :class:`SmallCNNTeacher` (end of file).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["DistillationLoss", "SmallCNNTeacher", "hard_distillation_loss", "soft_distillation_loss"]


def _check_logits(student_cls_logits: Tensor, student_dist_logits: Tensor, teacher_logits: Tensor) -> None:
    named = {"student_cls_logits": student_cls_logits, "student_dist_logits": student_dist_logits}
    for name, t in {**named, "teacher_logits": teacher_logits}.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 2:
            raise ValueError(f"{name} must have shape (B, num_classes), got {tuple(t.shape)}")
    if not student_cls_logits.shape == student_dist_logits.shape == teacher_logits.shape:
        raise ValueError(
            "expected cls, dist and teacher logits of the same shape (B, num_classes), got "
            f"{tuple(student_cls_logits.shape)}, {tuple(student_dist_logits.shape)} and {tuple(teacher_logits.shape)}"
        )


def soft_distillation_loss(
    student_cls_logits: Tensor,
    student_dist_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor,
    *,
    alpha: float = 0.5,
    tau: float = 3.0,
) -> Tensor:
    """DeiT's soft distillation: the dist head matches the teacher's softened distribution.

    Shape: logits (B, K) each, labels (B,) -> scalar.
    """
    _check_logits(student_cls_logits, student_dist_logits, teacher_logits)
    base = F.cross_entropy(student_cls_logits, labels)
    teacher_logits = teacher_logits.detach()  # no gradient ever flows into the teacher
    kl = F.kl_div(
        F.log_softmax(student_dist_logits / tau, dim=-1),
        F.log_softmax(teacher_logits / tau, dim=-1),
        reduction="sum",
        log_target=True,
    )
    # NOTE(paper): the official code divides by B*K (``numel``, "legacy PyTorch behavior",
    # deit issue 61), not by B as a per-sample KL would; we follow the code.
    distill = kl * (tau * tau) / student_dist_logits.numel()
    return (1 - alpha) * base + alpha * distill


def hard_distillation_loss(
    student_cls_logits: Tensor,
    student_dist_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor,
    *,
    alpha: float = 0.5,
) -> Tensor:
    """DeiT's hard distillation: the dist head learns the teacher's argmax as a label.

    Shape: logits (B, K) each, labels (B,) -> scalar.
    """
    _check_logits(student_cls_logits, student_dist_logits, teacher_logits)
    base = F.cross_entropy(student_cls_logits, labels)
    teacher_labels = teacher_logits.detach().argmax(dim=-1)  # (B,)
    distill = F.cross_entropy(student_dist_logits, teacher_labels)  # dist head, not cls head (pitfall 9)
    return (1 - alpha) * base + alpha * distill


class DistillationLoss(nn.Module):
    """The official ``DistillationLoss``: runs the teacher and combines the two terms.

    ``teacher`` (in eval mode) runs under ``torch.no_grad()``; ``distillation_type`` is
    ``"hard"``, ``"soft"`` or ``"none"`` (cross-entropy on the cls head alone); ``alpha``
    weights the distillation term, ``tau`` is the soft temperature (DeiT: 0.5 and 3.0).
    """

    TYPES = ("hard", "soft", "none")

    def __init__(
        self, teacher: nn.Module, *, distillation_type: str = "hard", alpha: float = 0.5, tau: float = 3.0
    ) -> None:
        super().__init__()
        if distillation_type not in self.TYPES:
            raise ValueError(f"distillation_type must be one of {self.TYPES}, got {distillation_type!r}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if tau <= 0:
            raise ValueError(f"tau must be positive, got {tau}")
        self.teacher = teacher
        self.distillation_type = distillation_type
        self.alpha = alpha
        self.tau = tau

    def forward(self, inputs: Tensor, outputs: Tensor | tuple[Tensor, Tensor], labels: Tensor) -> Tensor:
        """Shape: inputs (B, C, H, W), outputs 2 x (B, K) [or (B, K) for "none"], labels (B,) -> scalar."""
        if isinstance(outputs, Tensor):
            if self.distillation_type == "none":
                return F.cross_entropy(outputs, labels)
            raise ValueError(
                f"{self.distillation_type} distillation needs a student with a distillation head that returns "
                f"(cls_logits, dist_logits), got a single logits tensor of shape {tuple(outputs.shape)}; use a "
                "distilled model (e.g. 'deit_tiny_distilled_patch16_224') in training mode"
            )
        if not (isinstance(outputs, (tuple, list)) and len(outputs) == 2):
            raise TypeError(
                f"expected outputs as a tensor or a (cls_logits, dist_logits) pair, got {type(outputs).__name__}"
                + (f" of length {len(outputs)}" if isinstance(outputs, (tuple, list)) else "")
            )
        cls_logits, dist_logits = outputs
        if self.distillation_type == "none":
            return F.cross_entropy(cls_logits, labels)
        if self.teacher.training:
            raise ValueError(
                "the teacher is in training mode (BatchNorm and dropout would change it); call teacher.eval()"
            )
        with torch.no_grad():
            teacher_logits = self.teacher(inputs)
        if self.distillation_type == "soft":
            return soft_distillation_loss(
                cls_logits, dist_logits, teacher_logits, labels, alpha=self.alpha, tau=self.tau
            )
        return hard_distillation_loss(cls_logits, dist_logits, teacher_logits, labels, alpha=self.alpha)


class SmallCNNTeacher(nn.Module):
    """A tiny convnet teacher for small grey images: three 3x3 conv-BN-ReLU layers (a max pool after
    the second), global average pooling, a linear head.

    Shape: x (B, in_chans, H, W) -> (B, num_classes), H, W >= 2.
    """

    def __init__(self, in_chans: int = 1, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        if in_chans <= 0 or num_classes <= 0 or width <= 0:
            raise ValueError(
                f"in_chans, num_classes and width must be positive, got {in_chans}, {num_classes}, {width}"
            )
        self.in_chans = in_chans

        def conv(c_in: int, c_out: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())

        self.features = nn.Sequential(
            conv(in_chans, width),  # (B, w, H, W)
            conv(width, width),
            nn.MaxPool2d(2),  # (B, w, H/2, W/2)
            conv(width, 2 * width),  # (B, 2w, H/2, W/2)
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),  # (B, 2w)
        )
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4 or x.shape[1] != self.in_chans:
            raise ValueError(f"expected images of shape (B, {self.in_chans}, H, W), got {tuple(x.shape)}")
        return self.head(self.features(x))
