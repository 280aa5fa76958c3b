"""Checks for the DeiT chapter: the hard- and soft-distillation losses (ERRATA 7)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vitlab import distill
from vitlab.checks._core import Case, CheckResult, KnownWrong, generator, run_check

Logits = tuple[Tensor, Tensor, Tensor, Tensor]


def _logits(seed: int, B: int, K: int) -> Logits:
    """Student cls and dist logits, teacher logits, and labels that differ from the teacher's argmax."""
    g = generator(seed)
    cls_logits, dist_logits, teacher_logits = (torch.randn(B, K, generator=g) * 2 for _ in range(3))
    labels = (teacher_logits.argmax(-1) + 1 + torch.arange(B)) % K  # the teacher is wrong on these
    return cls_logits, dist_logits, teacher_logits, labels


def _label(inputs: Logits, **hyper: float) -> str:
    B, K = inputs[0].shape
    settings = "".join(f", {name}={value}" for name, value in hyper.items())
    return f"logits ({B}, {K}){settings}"


def _hard(c: Tensor, d: Tensor, t: Tensor, y: Tensor, alpha: float = 0.5, *, wrong: str = "") -> Tensor:
    """Hard distillation; ``wrong`` names a known wrong variant."""
    t_labels = t.argmax(-1)
    if wrong == "cls_head":  # ERRATA 7: the teacher's labels on the class head
        return (1 - alpha) * F.cross_entropy(c, y) + alpha * F.cross_entropy(c, t_labels)
    if wrong == "note":  # ERRATA 7, the note's line as it stands
        return F.cross_entropy(c, t_labels)
    if wrong == "swapped_heads":
        return (1 - alpha) * F.cross_entropy(d, y) + alpha * F.cross_entropy(c, t_labels)
    if wrong == "swapped_alpha":
        return alpha * F.cross_entropy(c, y) + (1 - alpha) * F.cross_entropy(d, t_labels)
    if wrong == "probabilities":
        return (1 - alpha) * F.cross_entropy(c, y) + alpha * F.cross_entropy(d, t.softmax(-1))
    return distill.hard_distillation_loss(c, d, t, y, alpha=alpha)


def _hard_wrong(variant: str, message: str, erratum: int | None = None) -> KnownWrong:
    return KnownWrong(lambda c, d, t, y, alpha=0.5: _hard(c, d, t, y, alpha, wrong=variant), message, erratum)


_RIGHT = "the class head learns the true labels, the distillation head the teacher's argmax"

_HARD_WRONGS = (
    _hard_wrong("cls_head", f"the teacher's labels supervise the class head; {_RIGHT}: "
                "alpha * F.cross_entropy(dist_logits, teacher_logits.argmax(-1))", 7),
    _hard_wrong("note", f"the loss is F.cross_entropy(cls_logits, teacher_labels), as in the note; {_RIGHT}: "
                "(1 - alpha) * CE(cls_logits, labels) + alpha * CE(dist_logits, teacher_labels)", 7),
    _hard_wrong("swapped_heads", f"the two heads' targets are swapped; {_RIGHT}", 7),
    _hard_wrong("swapped_alpha", "alpha weights the wrong term: (1 - alpha) * CE(cls, labels) + "
                "alpha * CE(dist, teacher_labels)"),
    _hard_wrong("probabilities", "the targets are the teacher's probabilities; hard distillation uses its "
                "argmax as a label, teacher_logits.argmax(-1)"),
)  # fmt: skip


def hard_distillation_loss(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(cls_logits, dist_logits, teacher_logits, labels, alpha=0.5) -> loss``.

    DeiT's hard distillation: ``(1 - alpha) * CE(cls_logits, labels) +
    alpha * CE(dist_logits, teacher_logits.argmax(-1))``, cross-entropy averaged over the
    batch, as :func:`vitlab.distill.hard_distillation_loss`. The first case leaves
    ``alpha`` out (its default must be 0.5); the others pass ``alpha=``.

    Shape: logits (B, K) each, labels (B,) -> scalar tensor.
    """
    cases = []
    for seed, (B, K, alpha) in enumerate(((1, 5, None), (4, 10, 0.3), (3, 7, 0.5), (2, 3, 0.9))):
        inputs = _logits(seed, B, K)
        if alpha is None:
            cases.append(Case(_label(inputs), inputs))
        else:
            cases.append(Case(_label(inputs, alpha=alpha), inputs, {"alpha": alpha}))
    return run_check("hard_distillation_loss", fn, cases, _hard, known_wrong=_HARD_WRONGS)


def _soft(c: Tensor, d: Tensor, t: Tensor, y: Tensor, *, alpha: float, tau: float, wrong: str = "") -> Tensor:
    """Soft distillation; ``wrong`` names a known wrong variant."""
    if wrong == "":
        return distill.soft_distillation_loss(c, d, t, y, alpha=alpha, tau=tau)
    student = c if wrong == "cls_head" else d
    log_p_student = F.log_softmax(student / tau, dim=-1)
    log_p_teacher = F.log_softmax(t / tau, dim=-1)
    if wrong == "reversed":  # KL(student || teacher)
        kl = F.kl_div(log_p_teacher, log_p_student, reduction="sum", log_target=True)
    else:  # KL(teacher || student)
        kl = F.kl_div(log_p_student, log_p_teacher, reduction="sum", log_target=True)
    factor = 1.0 if wrong == "no_tau_squared" else tau * tau
    divisor = student.shape[0] if wrong == "batchmean" else student.numel()
    return (1 - alpha) * F.cross_entropy(c, y) + alpha * kl * factor / divisor


def _soft_wrong(variant: str, message: str, erratum: int | None = None) -> KnownWrong:
    def fn(c: Tensor, d: Tensor, t: Tensor, y: Tensor, *, alpha: float, tau: float) -> Tensor:
        return _soft(c, d, t, y, alpha=alpha, tau=tau, wrong=variant)

    return KnownWrong(fn, message, erratum)


_SOFT_WRONGS = (
    _soft_wrong("cls_head", "the teacher's distribution supervises the class head; it supervises the "
                "distillation head (dist_logits), the class head learns the true labels", 7),
    _soft_wrong("reversed", "the KL divergence is reversed; DeiT uses KL(teacher || student): "
                "F.kl_div(log_softmax(dist / tau), log_softmax(teacher / tau), log_target=True)"),
    _soft_wrong("no_tau_squared", "the KL term is not multiplied by tau**2 (which keeps its gradients "
                "comparable across temperatures)"),
    _soft_wrong("batchmean", "the KL sum is divided by the batch size B (reduction='batchmean'); the official "
                "DeiT code, which vitlab.distill follows, divides it by B * K, the number of logits"),
)  # fmt: skip


def soft_distillation_loss(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(cls_logits, dist_logits, teacher_logits, labels, alpha=..., tau=...) -> loss``.

    DeiT's soft distillation as the official code writes it (and
    :func:`vitlab.distill.soft_distillation_loss`):
    ``(1 - alpha) * CE(cls_logits, labels) + alpha * tau**2 * KL / (B * K)``, where
    ``KL = sum KL(softmax(teacher / tau) || softmax(dist / tau))`` over the batch. Every
    case passes ``alpha=`` and ``tau=`` by keyword.

    Shape: logits (B, K) each, labels (B,) -> scalar tensor.
    """
    cases = []
    for seed, (B, K, alpha, tau) in enumerate(((1, 5, 0.5, 3.0), (4, 10, 0.1, 3.0), (3, 7, 0.3, 2.0))):
        inputs = _logits(100 + seed, B, K)
        cases.append(Case(_label(inputs, alpha=alpha, tau=tau), inputs, {"alpha": alpha, "tau": tau}))
    return run_check("soft_distillation_loss", fn, cases, _soft, known_wrong=_SOFT_WRONGS)
