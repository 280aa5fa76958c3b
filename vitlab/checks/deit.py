"""Checks for the DeiT chapter: the hard- and soft-distillation losses (pitfall 9)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vitlab.checks._core import Case, CheckResult, KnownWrong, generator, run_check

Logits = tuple[Tensor, Tensor, Tensor, Tensor]

# Logits this large (in size) overflow exp in float32: exp(89) is inf.
_OVERFLOW = 88.0


def _logits(seed: int, B: int, K: int, scale: float = 2.0) -> Logits:
    """Student cls and dist logits, teacher logits (standard deviation ``scale``), and labels
    that differ from the teacher's argmax."""
    g = generator(seed)
    cls_logits, dist_logits, teacher_logits = (torch.randn(B, K, generator=g) * scale for _ in range(3))
    labels = (teacher_logits.argmax(-1) + 1 + torch.arange(B)) % K  # the teacher is wrong on these
    return cls_logits, dist_logits, teacher_logits, labels


def _label(inputs: Logits, **hyper: float) -> str:
    B, K = inputs[0].shape
    settings = "".join(f", {name}={value}" for name, value in hyper.items())
    largest = max(x.abs().max().item() for x in inputs[:3])
    size = f", large logits (up to {largest:.0f} in size)" if largest > _OVERFLOW else ""
    return f"logits ({B}, {K}){settings}{size}"


_NOT_FINITE = (
    "the loss is {} for large logits: a softmax written as exp(x) / sum(exp(x)) overflows in float32 once a "
    "logit passes ~88 (inf / inf is NaN), and log(softmax(x)) underflows to log(0) = -inf; use "
    "F.cross_entropy and F.log_softmax, which compute x - logsumexp(x) with the max subtracted"
)


def _overflowing(reference: Callable[..., Tensor]) -> tuple[KnownWrong, KnownWrong]:
    """The loss NaN, or inf, on the large-logit case: the two ways a loss written from the formula overflows."""
    return _not_finite(reference, math.nan), _not_finite(reference, math.inf)


def _not_finite(reference: Callable[..., Tensor], value: float) -> KnownWrong:
    """A loss that is ``value`` (NaN or inf) where a logit is past float32's exp range, right elsewhere:
    what a softmax or cross-entropy written from the formula gives on the large-logit case."""

    def fn(c: Tensor, d: Tensor, t: Tensor, y: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        right = reference(c, d, t, y, *args, **kwargs)
        large = max(x.abs().max().item() for x in (c, d, t)) > _OVERFLOW
        return torch.full_like(right, value) if large else right

    return KnownWrong(fn, _NOT_FINITE.format("NaN" if math.isnan(value) else "inf"))


def _hard(c: Tensor, d: Tensor, t: Tensor, y: Tensor, alpha: float = 0.5, *, wrong: str = "") -> Tensor:
    """Hard distillation; ``wrong`` names a known wrong variant."""
    t_labels = t.argmax(-1)
    if wrong == "cls_head":  # pitfall 9: the teacher's labels on the class head
        return (1 - alpha) * F.cross_entropy(c, y) + alpha * F.cross_entropy(c, t_labels)
    if wrong == "cls_only":  # pitfall 9 as often written: the class head and the teacher's labels, nothing else
        return F.cross_entropy(c, t_labels)
    if wrong == "no_alpha":  # the two terms averaged whatever alpha is
        return 0.5 * F.cross_entropy(c, y) + 0.5 * F.cross_entropy(d, t_labels)
    if wrong == "swapped_heads":
        return (1 - alpha) * F.cross_entropy(d, y) + alpha * F.cross_entropy(c, t_labels)
    if wrong == "swapped_alpha":
        return alpha * F.cross_entropy(c, y) + (1 - alpha) * F.cross_entropy(d, t_labels)
    if wrong == "probabilities":
        return (1 - alpha) * F.cross_entropy(c, y) + alpha * F.cross_entropy(d, t.softmax(-1))
    return (1 - alpha) * F.cross_entropy(c, y) + alpha * F.cross_entropy(d, t_labels)


def _variant(loss: Callable[..., Tensor], variant: str, message: str, pitfall: int | None = None) -> KnownWrong:
    """The known wrong answer ``loss(..., wrong=variant)``."""
    return KnownWrong(partial(loss, wrong=variant), message, pitfall)


_hard_wrong = partial(_variant, _hard)

_RIGHT = "the class head learns the true labels, the distillation head the teacher's argmax"

_HARD_WRONGS = (
    _hard_wrong("cls_head", f"the teacher's labels supervise the class head; {_RIGHT}: "
                "alpha * F.cross_entropy(dist_logits, teacher_logits.argmax(-1))", 9),
    _hard_wrong("cls_only", "the loss is F.cross_entropy(cls_logits, teacher_labels) alone, so the true labels "
                f"and the distillation head play no part; {_RIGHT}: "
                "(1 - alpha) * CE(cls_logits, labels) + alpha * CE(dist_logits, teacher_labels)", 9),
    _hard_wrong("swapped_heads", f"the two heads' targets are swapped; {_RIGHT}", 9),
    _hard_wrong("swapped_alpha", "alpha weights the wrong term: (1 - alpha) * CE(cls, labels) + "
                "alpha * CE(dist, teacher_labels)"),
    _hard_wrong("no_alpha", "alpha is ignored (the two terms are averaged); weight them (1 - alpha) and alpha: "
                "(1 - alpha) * CE(cls, labels) + alpha * CE(dist, teacher_labels)"),
    _hard_wrong("probabilities", "the targets are the teacher's probabilities; hard distillation uses its "
                "argmax as a label, teacher_logits.argmax(-1)"),
    *_overflowing(_hard),
)  # fmt: skip


def hard_distillation_loss(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(cls_logits, dist_logits, teacher_logits, labels, alpha=0.5) -> loss``: DeiT's hard distillation.

    ``(1 - alpha) * CE(cls_logits, labels) + alpha * CE(dist_logits, teacher_logits.argmax(-1))``.

    Shape: logits (B, K) each, labels (B,) -> scalar tensor.
    """
    cases = []
    sizes = ((1, 5, None, 2.0), (4, 10, 0.3, 2.0), (3, 7, 0.5, 2.0), (2, 3, 0.9, 2.0), (4, 10, 0.3, 100.0))
    for seed, (B, K, alpha, scale) in enumerate(sizes):
        inputs = _logits(seed, B, K, scale)
        if alpha is None:
            cases.append(Case(_label(inputs), inputs))
        else:
            cases.append(Case(_label(inputs, alpha=alpha), inputs, {"alpha": alpha}))
    return run_check("hard_distillation_loss", fn, cases, _hard, known_wrong=_HARD_WRONGS)


def _soft(c: Tensor, d: Tensor, t: Tensor, y: Tensor, *, alpha: float, tau: float, wrong: str = "") -> Tensor:
    """Soft distillation as the official DeiT code writes it; ``wrong`` names a known wrong variant."""
    student = c if wrong == "cls_head" else d
    log_p_student = F.log_softmax(student / tau, dim=-1)
    log_p_teacher = F.log_softmax(t if wrong == "teacher_tau" else t / tau, dim=-1)
    if wrong == "reversed":  # KL(student || teacher)
        kl = F.kl_div(log_p_teacher, log_p_student, reduction="sum", log_target=True)
    elif wrong == "probability_input":  # probabilities where F.kl_div wants log-probabilities
        kl = F.kl_div(log_p_student.exp(), log_p_teacher.exp(), reduction="sum")
    elif wrong == "log_target_missing":
        kl = F.kl_div(log_p_student, log_p_teacher, reduction="sum")
    else:  # KL(teacher || student)
        kl = F.kl_div(log_p_student, log_p_teacher, reduction="sum", log_target=True)
    factor = 1.0 if wrong == "no_tau_squared" else tau * tau
    divisor = student.shape[0] if wrong == "batchmean" else student.numel()
    return (1 - alpha) * F.cross_entropy(c, y) + alpha * kl * factor / divisor


_soft_wrong = partial(_variant, _soft)
_SOFT_WRONGS = (
    _soft_wrong("cls_head", "the teacher's distribution supervises the class head; it supervises the "
                "distillation head (dist_logits), the class head learns the true labels", 9),
    _soft_wrong("reversed", "the KL divergence is reversed; DeiT uses KL(teacher || student): "
                "F.kl_div(log_softmax(dist / tau), log_softmax(teacher / tau), log_target=True)"),
    _soft_wrong("no_tau_squared", "the KL term is not multiplied by tau**2 (which keeps its gradients "
                "comparable across temperatures)"),
    _soft_wrong("batchmean", "the KL sum is divided by the batch size B (reduction='batchmean'); the official "
                "DeiT code, which vitlab.distill follows, divides it by B * K, the number of logits"),
    _soft_wrong("probability_input", "F.kl_div got the student's probabilities as its input; its input must be "
                "log-probabilities: F.kl_div(F.log_softmax(dist / tau, -1), ...)"),
    _soft_wrong("log_target_missing", "the target is log-probabilities but log_target=True is missing, so "
                "F.kl_div reads them as probabilities; pass log_target=True (or give it softmax(teacher / tau))"),
    _soft_wrong("teacher_tau", "the teacher's logits are not divided by tau; soften both distributions: "
                "softmax(teacher_logits / tau) and log_softmax(dist_logits / tau)"),
    *_overflowing(_soft),
)  # fmt: skip


def soft_distillation_loss(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(cls_logits, dist_logits, teacher_logits, labels, alpha=..., tau=...) -> loss``.

    ``(1 - alpha) * CE(cls_logits, labels) + alpha * tau**2 * KL / (B * K)``,
    ``KL = sum KL(softmax(teacher / tau) || softmax(dist / tau))``, as the official DeiT code.

    Shape: logits (B, K) each, labels (B,) -> scalar tensor.
    """
    cases = []
    sizes = ((1, 5, 0.5, 3.0, 2.0), (4, 10, 0.1, 3.0, 2.0), (3, 7, 0.3, 2.0, 2.0), (4, 10, 0.5, 3.0, 300.0))
    for seed, (B, K, alpha, tau, scale) in enumerate(sizes):
        inputs = _logits(100 + seed, B, K, scale)
        cases.append(Case(_label(inputs, alpha=alpha, tau=tau), inputs, {"alpha": alpha, "tau": tau}))
    return run_check("soft_distillation_loss", fn, cases, _soft, known_wrong=_SOFT_WRONGS)


def _soft_target_ce(logits: Tensor, targets: Tensor) -> Tensor:
    """timm's ``SoftTargetCrossEntropy``: ``-sum_k targets_k log softmax(logits)_k``, averaged over the batch."""
    return -(targets * F.log_softmax(logits, dim=-1)).sum(-1).mean()


def _mixup_hard(c: Tensor, d: Tensor, t: Tensor, targets: Tensor, alpha: float = 0.5, *, wrong: str = "") -> Tensor:
    """The official ``DistillationLoss`` with Mixup on: a soft-target class head, the teacher's argmax on the other;
    ``wrong`` names a known wrong variant."""
    t_labels = t.argmax(-1)
    if wrong == "argmax_targets":
        return (1 - alpha) * F.cross_entropy(c, targets.argmax(-1)) + alpha * F.cross_entropy(d, t_labels)
    if wrong == "cls_head":  # pitfall 9: the teacher's labels on the class head
        return (1 - alpha) * _soft_target_ce(c, targets) + alpha * F.cross_entropy(c, t_labels)
    if wrong == "mixed_targets":
        return (1 - alpha) * _soft_target_ce(c, targets) + alpha * _soft_target_ce(d, targets)
    if wrong == "probabilities":
        return (1 - alpha) * _soft_target_ce(c, targets) + alpha * _soft_target_ce(d, t.softmax(-1))
    if wrong == "swapped_alpha":
        return alpha * _soft_target_ce(c, targets) + (1 - alpha) * F.cross_entropy(d, t_labels)
    loss = (1 - alpha) * _soft_target_ce(c, targets) + alpha * F.cross_entropy(d, t_labels)
    return c.shape[0] * loss if wrong == "summed" else loss


def _mixup_inputs(seed: int, B: int, K: int) -> Logits:
    """Student and teacher logits, and Mixup targets: each row blends two different one-hot labels."""
    g = generator(300 + seed)
    cls_logits, dist_logits, teacher_logits = (2 * torch.randn(B, K, generator=g) for _ in range(3))
    first = torch.randint(0, K, (B,), generator=g)
    second = (first + 1 + torch.randint(0, K - 1, (B,), generator=g)) % K  # never the same class
    lam = 0.2 + 0.6 * torch.rand(B, 1, generator=g)  # the share of the first image
    targets = lam * F.one_hot(first, K) + (1 - lam) * F.one_hot(second, K)  # (B, K), rows sum to 1
    return cls_logits, dist_logits, teacher_logits, targets


_mixup_wrong = partial(_variant, _mixup_hard)
_MIXUP_WRONGS = (
    _mixup_wrong("argmax_targets", "the class head learns the argmax of the mixed targets; a Mixup target is a "
                 "distribution, so use the soft-target cross-entropy, "
                 "-(targets * log_softmax(cls_logits)).sum(-1).mean()"),
    _mixup_wrong("cls_head", "the teacher's labels train the class head, the token-free variant; in DeiT⚗ they train "
                 "the distillation head: F.cross_entropy(dist_logits, teacher_logits.argmax(-1))", 9),
    _mixup_wrong("mixed_targets", "the distillation head learns the mixed targets; it learns the teacher's decision on "
                 "the blended image, teacher_logits.argmax(-1)"),
    _mixup_wrong("probabilities", "the distillation head learns the teacher's probabilities; hard distillation takes "
                 "its decision, teacher_logits.argmax(-1), as a label"),
    _mixup_wrong("swapped_alpha", "alpha weights the wrong term: (1 - alpha) * class-head loss + alpha * "
                 "distillation-head loss"),
    _mixup_wrong("summed", "the losses are summed over the batch; average them over the B images"),
    *_overflowing(_mixup_hard),
)  # fmt: skip


def mixup_hard_distillation_loss(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(cls_logits, dist_logits, teacher_logits, targets, alpha=0.5) -> loss``: hard distillation with Mixup.

    ``(1 - alpha) * -(targets * log_softmax(cls_logits)).sum(-1).mean() + alpha * CE(dist_logits,
    teacher_logits.argmax(-1))``, the official ``DistillationLoss`` with ``SoftTargetCrossEntropy``.

    Shape: logits (B, K) each, targets (B, K) -> scalar tensor.
    """
    cases = []
    for seed, (B, K, alpha) in enumerate(((4, 5, None), (6, 10, 0.3), (3, 7, 0.8), (4, 10, 0.5))):
        inputs = _mixup_inputs(seed, B, K)
        label = f"logits ({B}, {K}), Mixup targets ({B}, {K})"
        if seed == 3:
            inputs = (50 * inputs[0], 50 * inputs[1], 50 * inputs[2], inputs[3])
            label += f", large logits (up to {max(x.abs().max().item() for x in inputs[:3]):.0f} in size)"
        if alpha is None:
            cases.append(Case(label, inputs))
        else:
            cases.append(Case(f"{label}, alpha={alpha}", inputs, {"alpha": alpha}))
    return run_check("mixup_hard_distillation_loss", fn, cases, _mixup_hard, known_wrong=_MIXUP_WRONGS)


def _soft_from_probs(
    c: Tensor, d: Tensor, p: Tensor, y: Tensor, *, alpha: float, tau: float, wrong: str = ""
) -> Tensor:
    """Soft distillation when the teacher gives probabilities ``p = softmax(Z_t)``: ``log p`` is ``Z_t``
    less a constant per row, so ``softmax(log(p) / tau) = softmax(Z_t / tau)``; ``wrong`` names a known
    wrong variant."""
    if wrong in _SOFT_VARIANTS:
        return _soft(c, d, p.log(), y, alpha=alpha, tau=tau, wrong=wrong)
    log_target = {
        "": F.log_softmax(p.log() / tau, dim=-1),
        "untempered": p.log(),  # the teacher's probabilities as they are
        "softmax_of_probs": F.log_softmax(p / tau, dim=-1),  # probabilities taken for logits
        "power_tau": F.log_softmax(p.log() * tau, dim=-1),  # p**tau renormalised: sharpened
    }[wrong]
    kl = F.kl_div(F.log_softmax(d / tau, dim=-1), log_target, reduction="sum", log_target=True)
    return (1 - alpha) * F.cross_entropy(c, y) + alpha * kl * tau * tau / d.numel()


_SOFT_VARIANTS = ("cls_head", "reversed", "no_tau_squared", "batchmean")

_probs_wrong = partial(_variant, _soft_from_probs)
_PROBS_WRONGS = (
    _probs_wrong("untempered", "the teacher's probabilities are used as they are, at temperature 1; soften them "
                 "with the same tau as the student: softmax(log(teacher_probs) / tau), i.e. teacher_probs**(1/tau) "
                 "renormalised"),
    _probs_wrong("softmax_of_probs", "a softmax was applied to the probabilities themselves, softmax(teacher_probs "
                 "/ tau); they are not logits: take their log first, log(p) is the teacher's logits less a "
                 "constant per row, softmax(log(teacher_probs) / tau)"),
    _probs_wrong("power_tau", "the probabilities are raised to the power tau, which sharpens them; softening by "
                 "tau is the power 1/tau: softmax(log(teacher_probs) / tau)"),
    _probs_wrong("cls_head", "the teacher's distribution supervises the class head; it supervises the "
                 "distillation head (dist_logits), the class head learns the true labels", 9),
    _probs_wrong("reversed", "the KL divergence is reversed; DeiT uses KL(teacher || student): "
                 "F.kl_div(log_softmax(dist / tau), teacher's log-probabilities at tau, log_target=True)"),
    _probs_wrong("no_tau_squared", "the KL term is not multiplied by tau**2 (which keeps its gradients "
                 "comparable across temperatures)"),
    _probs_wrong("batchmean", "the KL sum is divided by the batch size B (reduction='batchmean'); the official "
                 "DeiT code divides it by B * K, the number of logits"),
    *_overflowing(_soft_from_probs),
)  # fmt: skip


def soft_distillation_from_probs(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(cls_logits, dist_logits, teacher_probs, labels, *, alpha, tau) -> loss``.

    :func:`soft_distillation_loss` for a teacher that gives probabilities: the softened
    target is ``softmax(log(teacher_probs) / tau)``.

    Shape: logits (B, K) each, teacher_probs (B, K) rows summing to 1, labels (B,) -> scalar tensor.
    """
    cases = []
    sizes = ((2, 5, 0.5, 3.0, 1.0), (4, 10, 0.1, 3.0, 1.0), (3, 7, 0.3, 2.0, 1.0), (4, 10, 0.5, 3.0, 150.0))
    for seed, (B, K, alpha, tau, gain) in enumerate(sizes):
        c, d, t, y = _logits(500 + seed, B, K, 2.0)
        c, d = gain * c, gain * d  # the student's logits; the teacher's probabilities stay positive
        probs = t.softmax(-1)
        label = f"logits ({B}, {K}), teacher_probs ({B}, {K}), alpha={alpha}, tau={tau}"
        if gain != 1.0:
            label += f", large logits (up to {max(c.abs().max().item(), d.abs().max().item()):.0f} in size)"
        cases.append(Case(label, (c, d, probs, y), {"alpha": alpha, "tau": tau}))
    return run_check("soft_distillation_from_probs", fn, cases, _soft_from_probs, known_wrong=_PROBS_WRONGS)
