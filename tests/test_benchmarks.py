"""benchmarks/throughput.py: its statistics, its model lists and one short run (no timed asserts)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import vitlab
from vitlab.family import FAMILIES, count_macs, family_of
from vitlab.utils import count_parameters

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import levit_kernels  # noqa: E402
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


def test_fewer_than_five_runs_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        throughput.parse_args(["--runs", "4"])
    assert "--runs must be at least 5" in capsys.readouterr().err


def test_the_model_lists_come_from_the_families() -> None:
    # One preset per family with a reference, each family's FAMILY.benchmark_preset.
    expected = {info.benchmark_preset: family for family, info in FAMILIES.items() if info.benchmark_preset}
    assert list(throughput.ALL_MODELS) == list(expected)
    assert {family_of(name) for name in throughput.ALL_MODELS} == set(expected.values())
    assert throughput.ALL_MODELS == {
        "vit_base_patch16_224": "timm",
        "deit_small_patch16_224": "timm",
        "cait_xxs24_224": "timm",
        "crossvit_small_240": "timm",
        "pit_s_224": "timm",
        "levit_128s": "timm",
        "cvt_13": "hf",
    }
    for family, info in FAMILIES.items():  # a family without a reference has no benchmark preset
        assert (info.benchmark_preset is None) == (throughput.reference_library(family) is None), family
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
            "--warmup",
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


def test_the_levit_kernel_check_reports_both_maps(capsys: pytest.CaptureFixture[str]) -> None:
    # Which kernel PyTorch picks is not asserted here (benchmarks/levit_kernels.py checks it);
    # only that the check profiles both layers and that its exit status follows its verdicts.
    status = levit_kernels.main()
    lines = [line for line in capsys.readouterr().out.splitlines() if "maps" in line]
    assert [line.split(" maps")[0].split()[-1] for line in lines] == ["144", "36"]
    assert status == (0 if all(line.startswith("ok") for line in lines) else 1)
