"""vitlab.checks.mixup_hard_distillation_loss: a right answer passes, each known mistake is named.

The "student" functions are written independently of the check's reference (F.cross_entropy
with probability targets, log-softmax sums), and the reference itself is compared with the
official DistillationLoss built from vitlab.distill with a soft-target base criterion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from conftest import assert_named_mistake, assert_passes, run  # run: one printed line and a CheckResult
from vitlab.checks import deit as deit_checks

NAME = "mixup_hard_distillation_loss"


def mixup_ok(c: Tensor, d: Tensor, t: Tensor, targets: Tensor, alpha: float = 0.5) -> Tensor:
    # F.cross_entropy accepts class probabilities as targets (PyTorch >= 1.10)
    return (1 - alpha) * F.cross_entropy(c, targets) + alpha * F.cross_entropy(d, t.argmax(dim=1))


def soft_ce(logits: Tensor, targets: Tensor) -> Tensor:
    return (-targets * logits.log_softmax(1)).sum(1).mean()


W = pytest.param  # (student function, words the message must contain, pitfall)
WRONG = [
    W(lambda c, d, t, y, alpha=0.5: mixup_ok(c, d, t, y.argmax(1), alpha), "argmax of the mixed targets", None,
      id="argmax_targets"),
    W(lambda c, d, t, y, alpha=0.5: (1 - alpha) * soft_ce(c, y) + alpha * F.cross_entropy(c, t.argmax(1)),
      "train the class head", 9, id="teacher_on_class_head"),
    W(lambda c, d, t, y, alpha=0.5: (1 - alpha) * soft_ce(c, y) + alpha * soft_ce(d, y), "learns the mixed targets",
      None, id="dist_head_on_targets"),
    W(lambda c, d, t, y, alpha=0.5: (1 - alpha) * soft_ce(c, y) + alpha * F.cross_entropy(d, t.softmax(1)),
      "teacher's probabilities", None, id="teacher_probabilities"),
    W(lambda c, d, t, y, alpha=0.5: mixup_ok(c, d, t, y, 1 - alpha), "alpha weights the wrong term", None,
      id="swapped_alpha"),
    W(lambda c, d, t, y, alpha=0.5: (1 - alpha) * (-y * c.log_softmax(1)).sum()
      + alpha * F.cross_entropy(d, t.argmax(1), reduction="sum"), "summed over the batch", None, id="summed"),
]  # fmt: skip


def test_reference_is_the_official_loss_with_soft_targets() -> None:
    """vitlab.distill.DistillationLoss given the mixed targets: F.cross_entropy takes them as probabilities,
    as SoftTargetCrossEntropy does in DeiT's main.py under Mixup."""
    from vitlab import distill

    c, d, t, targets = deit_checks._mixup_inputs(0, 5, 7)
    teacher = torch.nn.Identity().eval()  # the "images" are the teacher's logits
    loss = distill.DistillationLoss(teacher, distillation_type="hard", alpha=0.3)
    torch.testing.assert_close(deit_checks._mixup_hard(c, d, t, targets, 0.3), loss(t, (c, d), targets))


def test_targets_are_mixed_distributions() -> None:
    _, _, _, targets = deit_checks._mixup_inputs(1, 6, 10)
    torch.testing.assert_close(targets.sum(1), torch.ones(6))
    assert ((targets > 0).sum(1) == 2).all() and (targets.max(1).values < 1).all()


def test_correct_solution_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert_passes(capsys, NAME, mixup_ok)


@pytest.mark.parametrize(("fn", "words", "pitfall"), WRONG)
def test_known_wrong_answer_fails_with_its_message(
    capsys: pytest.CaptureFixture[str], fn: Callable[..., Any], words: str, pitfall: int | None
) -> None:
    assert_named_mistake(capsys, NAME, fn, words, pitfall)


def test_a_random_answer_fails(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, NAME, lambda c, d, t, y, alpha=0.5: torch.rand(()))
    assert not result and "expected" in line


# ---------------------------------------------------------------- soft_distillation_from_probs

PROBS = "soft_distillation_from_probs"


def probs_ok(c: Tensor, d: Tensor, p: Tensor, y: Tensor, *, alpha: float, tau: float) -> Tensor:
    """p**(1/tau) renormalised is softmax(Z_t / tau); the KL written out, summed, divided by B * K."""
    target = p ** (1 / tau)
    target = target / target.sum(1, keepdim=True)
    kl = (target * (target.log() - (d / tau).log_softmax(1))).sum()
    return (1 - alpha) * F.cross_entropy(c, y) + alpha * tau**2 * kl / d.numel()


def probs_with(c: Tensor, d: Tensor, target: Tensor, y: Tensor, *, alpha: float, tau: float,
               factor: float | None = None, divisor: int | None = None, head: Tensor | None = None,
               reverse: bool = False) -> Tensor:  # fmt: skip
    """The loss with a given softened teacher distribution ``target`` and the knobs of the other slips."""
    student = (d if head is None else head) / tau
    if reverse:
        q = student.softmax(1)
        kl = (q * (q.log() - target.log())).sum()
    else:
        kl = (target * (target.log() - student.log_softmax(1))).sum()
    factor = tau**2 if factor is None else factor
    return (1 - alpha) * F.cross_entropy(c, y) + alpha * factor * kl / (d.numel() if divisor is None else divisor)


def tempered(p: Tensor, power: float) -> Tensor:
    q = p**power
    return q / q.sum(1, keepdim=True)


PROBS_WRONG = [
    W(lambda c, d, p, y, *, alpha, tau: probs_with(c, d, p, y, alpha=alpha, tau=tau), "as they are", None,
      id="untempered"),
    W(lambda c, d, p, y, *, alpha, tau: probs_with(c, d, (p / tau).softmax(1), y, alpha=alpha, tau=tau),
      "softmax was applied to the probabilities", None, id="softmax_of_probs"),
    W(lambda c, d, p, y, *, alpha, tau: probs_with(c, d, tempered(p, tau), y, alpha=alpha, tau=tau),
      "power tau", None, id="power_tau"),
    W(lambda c, d, p, y, *, alpha, tau: probs_with(c, d, tempered(p, 1 / tau), y, alpha=alpha, tau=tau, head=c),
      "supervises the class head", 9, id="class_head"),
    W(lambda c, d, p, y, *, alpha, tau: probs_with(c, d, tempered(p, 1 / tau), y, alpha=alpha, tau=tau,
                                                   reverse=True), "reversed", None, id="reversed_kl"),
    W(lambda c, d, p, y, *, alpha, tau: probs_with(c, d, tempered(p, 1 / tau), y, alpha=alpha, tau=tau, factor=1.0),
      "tau**2", None, id="no_tau_squared"),
    W(lambda c, d, p, y, *, alpha, tau: probs_with(c, d, tempered(p, 1 / tau), y, alpha=alpha, tau=tau,
                                                   divisor=d.shape[0]), "batch size B", None, id="batchmean"),
]  # fmt: skip


def test_probs_reference_is_the_soft_loss_on_the_teachers_logits() -> None:
    """Giving the teacher's probabilities instead of its logits changes nothing: the same loss as vitlab.distill."""
    from vitlab import distill

    c, d, t, y = deit_checks._logits(7, 4, 6)
    torch.testing.assert_close(
        deit_checks._soft_from_probs(c, d, t.softmax(-1), y, alpha=0.3, tau=2.5),
        distill.soft_distillation_loss(c, d, t, y, alpha=0.3, tau=2.5),
    )


def test_probs_correct_solution_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert_passes(capsys, PROBS, probs_ok)


@pytest.mark.parametrize(("fn", "words", "pitfall"), PROBS_WRONG)
def test_probs_known_wrong_answer_fails_with_its_message(
    capsys: pytest.CaptureFixture[str], fn: Callable[..., Any], words: str, pitfall: int | None
) -> None:
    assert_named_mistake(capsys, PROBS, fn, words, pitfall)


def test_probs_random_answer_fails(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, PROBS, lambda c, d, p, y, *, alpha, tau: torch.rand(()))
    assert not result and "expected" in line


def naive_log_softmax(x: Tensor) -> Tensor:
    """log(exp(x) / sum(exp(x))), written from the formula: NaN once a logit passes ~88 in float32."""
    return (torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)).log()


@pytest.mark.parametrize(
    ("name", "fn"),
    [
        (NAME, lambda c, d, t, y, alpha=0.5: (1 - alpha) * -(y * naive_log_softmax(c)).sum(-1).mean()
         + alpha * F.cross_entropy(d, t.argmax(-1))),
        (PROBS, lambda c, d, p, y, *, alpha, tau: (1 - alpha) * F.cross_entropy(c, y) + alpha * tau**2 / d.numel()
         * F.kl_div(naive_log_softmax(d / tau), F.softmax(p.log() / tau, -1), reduction="sum")),
    ],
    ids=["mixup", "probs"],
)  # fmt: skip
def test_a_softmax_that_overflows_fails_on_the_large_logit_case_only(
    capsys: pytest.CaptureFixture[str], name: str, fn: Callable[..., Any]
) -> None:
    result, line = run(capsys, name, fn)
    assert result.cases_total is not None and result.cases_passed == result.cases_total - 1, line
    assert result.case is not None and "large logits" in result.case and "for large logits" in line, line
