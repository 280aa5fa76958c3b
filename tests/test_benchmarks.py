"""benchmarks/throughput.py: its statistics, its model lists and one short run (no timed asserts)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import vitlab
from vitlab.family import FAMILIES, count_macs, family_of
from vitlab.utils import count_parameters

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import throughput  # noqa: E402
from vit_pytorch_models import VIT_PYTORCH_MODELS, build_vit_pytorch  # noqa: E402

# vit-pytorch follows these four closely: the same parameters and MACs within 1 %.
SAME_SHAPE = ["vit_base_patch16_224", "deit_small_patch16_224", "cait_xxs24_224", "cvt_13"]


def test_paired_ratio_of_a_variant_twice_as_fast() -> None:
    reference = [2.0, 4.0, 3.0, 2.2, 8.0]  # a slow phase in round 5 hits both alike
    variant = [t / 2 for t in reference]
    assert throughput.paired_ratio(reference, variant) == (2.0, 2.0, 2.0)


def test_paired_ratio_interval_contains_one_for_noise_around_one() -> None:
    generator = torch.Generator().manual_seed(0)
    reference = (1 + 0.1 * torch.rand(41, generator=generator)).tolist()
    variant = (1 + 0.1 * torch.rand(41, generator=generator)).tolist()
    ratio, low, high = throughput.paired_ratio(reference, variant)
    assert low < 1 < high and low <= ratio <= high and high - low < 0.1


def test_paired_ratio_needs_the_same_rounds() -> None:
    with pytest.raises(ValueError):
        throughput.paired_ratio([1.0, 2.0], [1.0])


def test_time_variants_pairs_each_round_with_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    # A fake Timer whose measurement is what the variant returns: per round, the reference
    # takes twice as long as the variant, and round 5 is slow for both (a busy machine).
    class FakeTimer:
        def __init__(self, stmt: str, *, globals: dict, num_threads: int, label: str) -> None:
            assert stmt == "fn()" and num_threads == torch.get_num_threads()
            self.fn = globals["fn"]

        def blocked_autorange(self, min_run_time: float) -> SimpleNamespace:
            return SimpleNamespace(median=self.fn())

    monkeypatch.setattr(throughput.torch_benchmark, "Timer", FakeTimer)
    rounds = [2.0, 4.0, 3.0, 2.2, 8.0]
    reference, variant = iter(rounds), iter(t / 2 for t in rounds)
    variants = {"ref": lambda: next(reference), "half": lambda: next(variant)}
    stats = throughput.time_variants(variants, "ref", argparse.Namespace(runs=5, min_run_time=0.0))
    assert stats["ref"]["wall"] == 3.0 and stats["half"]["wall"] == 1.5  # medians over rounds
    assert stats["ref"]["paired"] == 1.0
    assert (stats["half"]["paired"], stats["half"]["paired_low"], stats["half"]["paired_high"]) == (2.0, 2.0, 2.0)
    assert stats["half"]["spread"] == (8.0 - 2.0) / 3.0


def test_fewer_than_five_runs_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        throughput.parse_args(["--runs", "4"])
    assert "--runs must be at least 5" in capsys.readouterr().err


def test_the_model_list_has_one_preset_per_family_with_a_reference() -> None:
    # Every family that timm or HuggingFace has, once, in chapter order, with its library.
    families = [family_of(name) for name in throughput.ALL_MODELS]
    assert families == [family for family in FAMILIES if throughput.reference_library(family) is not None]
    assert list(throughput.ALL_MODELS.values()) == [throughput.reference_library(f) for f in families]
    assert throughput.HF_MODELS == tuple(vitlab.list_models("cvt_"))


def test_references_exist_where_the_script_says() -> None:
    assert all(throughput.has_reference(name) for name in throughput.ALL_MODELS)
    assert not throughput.has_reference("deepvit_s") and not throughput.has_reference("t2t_vit_14")
    assert set(throughput.ALL_MODELS) | {"deepvit_s", "t2t_vit_14"} == set(VIT_PYTORCH_MODELS)
    assert set(VIT_PYTORCH_MODELS) <= set(vitlab.list_models())


@pytest.mark.parametrize("name", list(VIT_PYTORCH_MODELS))
def test_vit_pytorch_counterpart_builds_and_classifies(name: str) -> None:
    size = vitlab.get_config(name).img_size
    with torch.device("meta"):
        model = build_vit_pytorch(name)
        logits = model(torch.empty(2, 3, size, size))
    assert logits.shape == (2, 1000)
    assert count_macs(model, (1, 3, size, size)) > 0


@pytest.mark.parametrize("name", SAME_SHAPE)
def test_vit_pytorch_counterpart_has_the_same_shape(name: str) -> None:
    size = vitlab.get_config(name).img_size
    with torch.device("meta"):
        theirs, ours = build_vit_pytorch(name), vitlab.create_model(name)
    assert count_parameters(theirs) == pytest.approx(count_parameters(ours), rel=0.01)
    shape = (1, 3, size, size)
    assert count_macs(theirs, shape) == pytest.approx(count_macs(ours, shape), rel=0.01)


def test_unknown_vit_pytorch_counterpart() -> None:
    with pytest.raises(ValueError, match=r"vit-pytorch has no counterpart configured for 'resnet50'"):
        build_vit_pytorch("resnet50")


@pytest.mark.slow
def test_a_short_run_prints_both_tables(capsys: pytest.CaptureFixture[str]) -> None:
    # The smallest model, one image, no warm-up: checks the plumbing, not the speed.
    throughput.main(
        [
            "--models",
            "levit_128s",
            "--runs",
            "5",
            "--min-run-time",
            "0",
            "--batch-size",
            "1",
            "--vit-pytorch",
            "--device",
            "cpu",
        ]
    )
    out = capsys.readouterr().out
    assert "max |logit diff| vs timm 0.0e+00" in out
    rows = [line for line in out.splitlines() if line.startswith("| levit_128s |")]
    assert len(rows) == 2, out  # the timm table and the vit-pytorch table
    assert "| 7.78 / 6.98 | 0.305 / 0.385 |" in rows[1]
