"""CPU time of the new exercise checks on a right answer ("well under a second" each).

    .venv/bin/python benchmarks/check_times.py

Each check runs its cases against the student's function and ``vitlab``'s reference. The
right answers are the independently written ones of the checks' tests (tests/test_checks_*.py).
Process time of the best of five runs on one thread is reported, so a busy machine does not
inflate it; the first run (which loads kernels) is not counted. No test asserts a time.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import test_checks_crossvit  # noqa: E402
import test_checks_cvt  # noqa: E402
import test_checks_deepvit  # noqa: E402
import test_checks_pit  # noqa: E402

import vitlab.checks  # noqa: E402

CASES = {
    "re_attention_map (ch. 5)": (vitlab.checks.re_attention_map, test_checks_deepvit.right_conv),
    "cross_attention_fusion (ch. 8)": (vitlab.checks.cross_attention_fusion, test_checks_crossvit.fusion_ok),
    "pit_pooling_stage (ch. 9)": (vitlab.checks.pit_pooling_stage, test_checks_pit.stage_ok),
    "cvt_conv_attention (ch. 11)": (vitlab.checks.cvt_conv_attention, test_checks_cvt.attention_ok),
}


def cpu_seconds(check, answer, runs: int = 5) -> float:
    best = float("inf")
    with contextlib.redirect_stdout(io.StringIO()):
        check(answer)  # warm-up
        for _ in range(runs):
            start = time.process_time()
            result = check(answer)
            best = min(best, time.process_time() - start)
    if not result:
        raise SystemExit(f"{check.__name__} did not pass its right answer: {result.message}")
    return best


def main() -> None:
    torch.set_num_threads(1)
    print(f"{'check':<34} {'CPU seconds':>11}")
    for label, (check, answer) in CASES.items():
        print(f"{label:<34} {cpu_seconds(check, answer):11.3f}")


if __name__ == "__main__":
    main()
