"""Checks for the training chapter: the warmup + cosine schedule and rollout for a mean-pooled head."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from vitlab.checks._core import Case, CheckResult, Expect, KnownWrong, generator, run_check, vary

# (total_steps, warmup_steps, min_ratio): a short and a long run, one with no warmup.
_SCHEDULES = ((100, 10, 0.0), (240, 24, 0.01), (30, 0, 0.1), (1000, 150, 0.05))


def _warmup_cosine(step: int, *, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> float:
    """Linear from 1/warmup to 1 over the warmup, then a half cosine from 1 down to ``min_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _after_warmup(change: Callable[..., float]) -> Callable[..., float]:
    """A known wrong schedule: :func:`vitlab.train.warmup_cosine` during the warmup, then
    ``change(step, **kwargs)``."""

    def schedule(step: int, **kwargs: Any) -> float:
        return _warmup_cosine(step, **kwargs) if step < kwargs["warmup_steps"] else change(step, **kwargs)

    return schedule


def _cosine_only(step: int, **kwargs: Any) -> float:
    """The half cosine 0.5 * (1 + cos(pi * progress)) alone: the schedule with min_ratio 0."""
    return _warmup_cosine(step, **{**kwargs, "min_ratio": 0.0})


def warmup_cosine(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(step, *, total_steps, warmup_steps, min_ratio=0.0) -> multiplier``, within 1e-6.

    ``(step + 1) / warmup_steps`` during the warmup, then ``min_ratio + (1 - min_ratio) * 0.5 *
    (1 + cos(pi * progress))``, ``progress = (step - warmup_steps) / (total_steps - warmup_steps)``.

    Shape: ints and a float -> one float.
    """
    cases = []
    schedules = vary(_SCHEDULES, lambda r: (r.randint(250, 999), r.randint(0, 60), r.random() / 10))
    for total, warmup, min_ratio in schedules:
        steps = sorted({0, max(warmup - 1, 0), warmup, warmup + 1, (warmup + total) // 2, total - 1, total})
        kwargs = {"total_steps": total, "warmup_steps": warmup, "min_ratio": min_ratio}
        cases += [Case(f"step={s}, total_steps={total}, warmup_steps={warmup}, min_ratio={min_ratio}", (s,), kwargs)
                  for s in steps]  # fmt: skip

    wrongs = [
        KnownWrong(lambda step, **kwargs: step / kwargs["warmup_steps"] if step < kwargs["warmup_steps"]
                   else _warmup_cosine(step, **kwargs),
                   "the warmup starts at 0 (step / warmup_steps), so the first step does not train; it starts at "
                   "1 / warmup_steps: (step + 1) / warmup_steps"),
        KnownWrong(_after_warmup(lambda step, **kwargs: _warmup_cosine(step, **{**kwargs, "warmup_steps": 0})),
                   "the cosine's progress counts from step 0; it starts when the warmup ends: "
                   "(step - warmup_steps) / (total_steps - warmup_steps)"),
        KnownWrong(_after_warmup(lambda step, **kwargs: kwargs["min_ratio"] + _cosine_only(step, **kwargs)),
                   "min_ratio is added to the full cosine, so the peak is 1 + min_ratio; scale the cosine by "
                   "(1 - min_ratio)"),
        KnownWrong(_after_warmup(lambda step, **kwargs: kwargs["min_ratio"] + (1 - kwargs["min_ratio"])
                                 * (2 * _cosine_only(step, **kwargs) - 1)),  # cos(pi * progress) itself
                   "cos(pi * progress) runs from 1 to -1: a negative learning rate; the half cosine is "
                   "0.5 * (1 + cos(pi * progress))"),
        KnownWrong(_cosine_only,
                   "the cosine ends at 0; it ends at min_ratio: min_ratio + (1 - min_ratio) * 0.5 * (1 + cos(...))"),
        KnownWrong(lambda step, **kwargs: _warmup_cosine(step, **{**kwargs, "warmup_steps": 0}),
                   "there is no warmup: the multiplier is 1 at step 0; it rises over the first warmup_steps steps"),
    ]  # fmt: skip
    # atol 1e-6: float32 is off by up to 1.3e-7 where the cosine nears 0 (1 + cos cancels),
    # while each slip above is off by 0.1 or more somewhere.
    expect = Expect(kind="number", rtol=1e-6, atol=1e-6)
    return run_check("warmup_cosine", fn, cases, _warmup_cosine, known_wrong=wrongs, expect=expect)


def _fused(maps: Sequence[Tensor]) -> list[Tensor]:
    """0.5 * mean-over-heads + 0.5 * I for every block. Shape: depth x (B, h, N, N) -> depth x (B, N, N)."""
    eye = torch.eye(maps[0].shape[-1])
    return [0.5 * a.mean(1) + 0.5 * eye for a in maps]


def _product(maps: Sequence[Tensor], *, first_on_left: bool = False) -> Tensor:
    rollout = maps[0]
    for a in maps[1:]:
        rollout = rollout @ a if first_on_left else a @ rollout
    return rollout


def _rollout(maps: Sequence[Tensor], *, add_residual: bool = True) -> Tensor:
    """Rollout of the heads' mean, ``R = Â_L ... Â_1``. Shape: depth x (B, h, N, N) -> (B, N, N)."""
    return _product(_fused(maps) if add_residual else [a.mean(1) for a in maps])


def _per_head(maps: Sequence[Tensor]) -> Tensor:
    """Rollout of each head on its own, then the mean over the heads."""
    eye = torch.eye(maps[0].shape[-1])
    return _product([0.5 * a + 0.5 * eye for a in maps]).mean(1)


def _mean_pool_relevance(maps: Sequence[Tensor]) -> Tensor:
    """The mean of the rollout's rows: what a mean-pooled head reads. Shape: depth x (B, h, N, N) -> (B, N)."""
    return _rollout(maps).mean(dim=1)


def mean_pool_rollout(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(attn_maps) -> relevance``: the mean of the rollout's rows, ``R.mean(dim=1)``.

    ``R = Â_L ... Â_1`` with ``Â = 0.5 * heads' mean + 0.5 * I`` per block (no class token).

    Shape: depth x (B, h, N, N) -> (B, N).
    """
    cases = []
    for seed, (depth, B, h, N) in enumerate(((1, 1, 2, 4), (2, 2, 2, 4), (3, 1, 3, 9), (4, 2, 4, 6))):
        g = generator(300 + seed)
        maps = [torch.randn(B, h, N, N, generator=g).mul(2).softmax(-1) for _ in range(depth)]
        cases.append(Case(f"{depth} block(s) of ({B}, {h}, {N}, {N})", (maps,)))
    wrongs = [
        KnownWrong(lambda maps: _rollout(maps)[:, 0],
                   "this is the first token's row, the class token's rollout; a mean-pooled head reads every "
                   "token, so average the rows of R: R.mean(dim=1)"),
        KnownWrong(lambda maps: _rollout(maps).mean(dim=-1),
                   "the columns are averaged (R.mean(dim=-1)), which gives 1/N for every token; average the rows "
                   "(over the output tokens i): R.mean(dim=1)"),
        KnownWrong(lambda maps: _rollout(maps, add_residual=False).mean(dim=1),
                   "the residual is left out: each block's map is 0.5 * A + 0.5 * I before the product"),
        KnownWrong(lambda maps: _product(_fused(maps), first_on_left=True).mean(dim=1),
                   "the blocks are multiplied in the wrong order; later blocks go on the left: R = Â_L ... Â_1"),
        KnownWrong(lambda maps: _fused(maps)[-1].mean(dim=1),
                   "only the last block's map is used; roll out all blocks first, then average the rows"),
        KnownWrong(lambda maps: _per_head(maps).mean(dim=1),
                   "each head is rolled out on its own and the heads averaged at the end; average the heads of "
                   "each block first, then multiply"),
    ]  # fmt: skip
    return run_check("mean_pool_rollout", fn, cases, _mean_pool_relevance, known_wrong=wrongs)
