"""Inference throughput of vitlab against its reference, same config and same weights, one process.

The reference is timm's model of the same name, or, for CvT, HuggingFace's
``CvtForImageClassification`` built from a ``CvtConfig`` (random init, like tests/test_cvt.py).
For every model, the reference's randomly initialised weights are converted into the vitlab
model (``vitlab.convert_state_dict``) and the logits are checked to agree within 1e-4 before
anything is timed. The input size is the vitlab config's ``img_size`` (240 for CrossViT-S).
Four variants, each a forward pass of ``--batch-size`` images:

* ``vitlab explicit``: vitlab with ``softmax(q k^T * scale) v`` written out
  (:func:`vitlab.set_fused_attention` with ``False``);
* ``vitlab fused``: vitlab as it runs by default, with ``F.scaled_dot_product_attention``
  (a model without any switchable layer gets one row, ``vitlab``);
* ``timm`` / ``hf``: the reference, in its default configuration;
* ``timm (control)`` / ``hf (control)``: a second instance of the reference, built the same
  way and given the same weights. Its ratio to the reference should be 1; how far it is
  from 1 is the noise floor. (A second instance rather than the same object timed twice:
  which model was built first can shift its speed by a few per cent, and vitlab's model is
  built after the reference too.)

Timing is ``torch.utils.benchmark.Timer.blocked_autorange``, with torch's thread count
(``--threads``) and, on a GPU, a synchronisation around every block. The variants take
turns, round after round (``--runs`` rounds; the starting variant rotates every round, so no
variant always runs first after another one heated the caches): in each round every variant
is timed for ``--min-run-time`` seconds (at least one pass, after one untimed warm-up pass),
giving its median time per pass in that round.

Reported per variant: the median over the rounds, as images/s, and its ratio to the
reference (> 1 means vitlab is faster). Also the *paired* ratio: in every round, the
reference's time divided by the variant's, whose median over the rounds comes with a 95%
bootstrap interval. The variants of a round ran seconds apart, so a slow phase of the
machine mostly cancels in it; an interval that contains 1 means no difference was measured.
fp32, eval mode, ``torch.inference_mode()``. The closing markdown table has one row per
model: the reference's images/s, then images/s and ratios of vitlab fused and of vitlab
explicit (the teaching path's cost), the control's ratio and the largest spread of any
variant's rounds.

``--vit-pytorch`` additionally times vitlab against lucidrains' vit-pytorch, whose models
have the same widths, depths and heads but are not the same models (vit_pytorch_models.py
lists the differences): no weights are shared, and the parameters and MACs of both are
printed, with the speed ratio per MAC.

``--memory`` additionally measures one training step (train mode, forward, cross-entropy,
backward) of vitlab fused, vitlab explicit and the reference, batch ``--batch-size``, and
reports the peak of the memory allocated during the step and the ratio vitlab / reference. On CUDA:
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus the memory
allocated before the step (weights). On CPU: ``torch.profiler.profile(profile_memory=True)``
records every allocation and free of the step; the peak is the maximum of their running
sum (CPU device), the total is the sum of all allocations.

Usage::

    python benchmarks/throughput.py                          # ViT-S/16 and ViT-B/16, batch 8
    python benchmarks/throughput.py --threads 2 --runs 9
    python benchmarks/throughput.py --all --threads 2 --runs 11 --memory
    python benchmarks/throughput.py --all --vit-pytorch --threads 2 --runs 11
    python benchmarks/throughput.py --models vit_tiny_patch16_224 --device cpu
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils import benchmark as torch_benchmark
from vit_pytorch_models import VIT_PYTORCH_MODELS, build_vit_pytorch

import vitlab
from vitlab.family import count_macs, family_of
from vitlab.registry import SOURCES
from vitlab.utils import count_parameters

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' reference helpers
from references import hf_config_fields  # noqa: E402

DEFAULT_MODELS = ("vit_small_patch16_224", "vit_base_patch16_224")


def reference_library(family: str) -> str | None:
    """The library a family's weights convert from: "timm" where its paper file has
    ``convert_timm``, else "hf" where it has ``convert_hf`` (CvT), else None."""
    module = importlib.import_module(f"vitlab.models.{family}")
    return next((source for source in SOURCES if hasattr(module, f"convert_{source}")), None)


# One preset per family that has a reference implementation, in chapter order: vitlab name
# -> the reference's library (DeepViT and T2T-ViT have none; --vit-pytorch times them).
ALL_MODELS: dict[str, str] = {
    "vit_base_patch16_224": "timm",
    "deit_small_patch16_224": "timm",
    "cait_xxs24_224": "timm",
    "crossvit_small_240": "timm",
    "pit_s_224": "timm",
    "levit_128s": "timm",
    "cvt_13": "hf",
}

# The presets whose only reference is HuggingFace (CvT: timm does not have it).
HF_MODELS: tuple[str, ...] = tuple(name for name in vitlab.list_models() if reference_library(family_of(name)) == "hf")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="timm/vitlab model names")
    parser.add_argument("--all", action="store_true", help=f"every model with a reference: {', '.join(ALL_MODELS)}")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--runs", type=int, default=7, help="rounds in which every variant is timed (>= 5)")
    parser.add_argument(
        "--min-run-time", type=float, default=0.2, help="seconds each variant is timed per round (at least one pass)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--device", default="auto", help="'auto' (cuda when present), 'cpu' or 'cuda'")
    parser.add_argument("--memory", action="store_true", help="also the peak memory of one forward+backward step")
    parser.add_argument(
        "--vit-pytorch",
        action="store_true",
        help="also vitlab vs vit-pytorch's model of the same shape, for every preset "
        f"it has ({', '.join(VIT_PYTORCH_MODELS)}), or for --models where it has them",
    )
    args = parser.parse_args(argv)
    if args.runs < 5:
        parser.error(f"--runs must be at least 5 for a meaningful median, got {args.runs}")
    if args.batch_size < 1 or args.min_run_time < 0:
        parser.error(f"need --batch-size >= 1 and --min-run-time >= 0, got {args.batch_size} and {args.min_run_time}")
    if args.all:
        args.models = list(ALL_MODELS)
    return args


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_machine(device: torch.device) -> str:
    import timm
    import transformers

    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    lines = [
        f"cpu: {cpu_name()}, os.cpu_count()={os.cpu_count()}, torch threads={torch.get_num_threads()}",
        f"python {platform.python_version()}, torch {torch.__version__}, timm {timm.__version__}, "
        f"transformers {transformers.__version__}",
        f"device: {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
        f"load average at start (1, 5, 15 min): {load}",
    ]
    return "\n".join(lines)


def source_of(name: str) -> str:
    """'hf' for the CvT presets (timm has no CvT), 'timm' otherwise."""
    return ALL_MODELS.get(name, "hf" if name in HF_MODELS else "timm")


def has_reference(name: str) -> bool:
    """Whether timm (or, for CvT, HuggingFace) has ``name``: DeepViT and T2T-ViT have neither."""
    import timm

    return name in ALL_MODELS or name in HF_MODELS or timm.is_model(name)


def build_reference(name: str, source: str) -> nn.Module:
    """The reference model, randomly initialised with seed 0, eval mode."""
    torch.manual_seed(0)
    if source == "hf":
        import transformers

        config = transformers.CvtConfig(**hf_config_fields(vitlab.get_config(name)))
        return transformers.CvtForImageClassification(config).eval()
    import timm

    return timm.create_model(name, pretrained=False).eval()


def logits_of(output: torch.Tensor | object) -> torch.Tensor:
    """The logits tensor of a model output (HF returns an output object with ``.logits``)."""
    return output if isinstance(output, torch.Tensor) else output.logits


def build_pair(name: str, device: torch.device) -> tuple[nn.Module, nn.Module, str, int, float]:
    """Reference model, a vitlab model carrying its weights, the source, the input size and
    the max |logit difference| on two random images."""
    source = source_of(name)
    reference = build_reference(name, source)
    model = vitlab.create_model(name).eval()
    model.load_state_dict(vitlab.convert_state_dict(name, reference.state_dict(), source), strict=True)
    size: int = vitlab.get_config(name).img_size
    images = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        diff = (model(images) - logits_of(reference(images))).abs().max().item()
    return model.to(device), reference.to(device), source, size, diff


def paired_ratio(reference: list[float], variant: list[float], resamples: int = 2000) -> tuple[float, float, float]:
    """Median over rounds of ``reference[r] / variant[r]`` (> 1: the variant is faster), with a
    95% bootstrap interval (rounds resampled with replacement, fixed seed).

    Both passes of a round ran within a second of each other, so a slow phase of the machine
    slows both and cancels in their ratio; the ratio of two medians has no such pairing.
    """
    ratios = [r / v for r, v in zip(reference, variant, strict=True)]
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return statistics.median(ratios), medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def vitlab_variants(model: nn.Module, images: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """One forward pass of ``model`` on ``images`` through its explicit and through its fused
    attention (``vitlab.set_fused_attention`` before each pass)."""

    def forward_with(fused: bool) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            vitlab.set_fused_attention(model, fused)  # a Python attribute flip: costs nothing
            return model(images)

        return run

    return {"vitlab explicit": forward_with(False), "vitlab fused": forward_with(True)}


def time_variants(
    variants: dict[str, Callable[[], object]], reference: str, args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    """``args.runs`` rounds in which every variant is timed (the starting variant rotates) by
    ``torch.utils.benchmark.Timer.blocked_autorange``. Per variant: the median over the
    rounds of the seconds per pass (``wall``), their spread, and the paired ratio to
    ``reference`` (``paired``, ``paired_low``, ``paired_high``, see :func:`paired_ratio`)."""
    names = list(variants)
    timers = {
        v: torch_benchmark.Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads(), label=v)
        for v, fn in variants.items()
    }
    times: dict[str, list[float]] = {v: [] for v in names}
    with torch.inference_mode():
        for r in range(args.runs):
            for v in names[r % len(names) :] + names[: r % len(names)]:  # rotate the start
                times[v].append(timers[v].blocked_autorange(min_run_time=args.min_run_time).median)
    result = {}
    for v, walls in times.items():
        paired, low, high = paired_ratio(times[reference], walls)
        result[v] = {
            "wall": statistics.median(walls),
            "spread": (max(walls) - min(walls)) / statistics.median(walls),
            "paired": paired,
            "paired_low": low,
            "paired_high": high,
        }
    return result


def benchmark(name: str, args: argparse.Namespace, device: torch.device) -> tuple[str, dict[str, dict[str, float]]]:
    """The reference's source and, per variant: the median seconds per forward pass, the
    spread over rounds, and the paired ratio to the reference (:func:`paired_ratio`:
    ``paired``, ``paired_low``, ``paired_high``)."""
    model, reference, source, size, diff = build_pair(name, device)
    if diff > 1e-4:
        raise RuntimeError(f"{name}: vitlab and {source} logits differ by {diff:.2e} (expected <= 1e-4)")
    images = torch.randn(args.batch_size, 3, size, size, generator=torch.Generator().manual_seed(1)).to(device)
    switchable = sum(hasattr(m, "fused_attn") for m in model.modules())

    variants: dict[str, Callable[[], object]] = (
        dict(vitlab_variants(model, images)) if switchable else {"vitlab": lambda: model(images)}
    )
    variants[source] = lambda: reference(images)
    control = build_reference(name, source).to(device)  # same seed, same weights
    control.load_state_dict(reference.state_dict())
    variants[f"{source} (control)"] = lambda: control(images)
    result = time_variants(variants, source, args)
    vitlab.set_fused_attention(model, True)
    print(
        f"\n{name}: {size} px, batch {args.batch_size}, {args.runs} runs, "
        f"max |logit diff| vs {source} {diff:.1e}, {switchable} attention layers with a fused path"
    )
    if args.memory:
        memory = {"vitlab": step_memory(model, images, device), source: step_memory(reference, images, device)}
        if switchable:  # the explicit (teaching) path's cost in memory too
            vitlab.set_fused_attention(model, False)
            memory["vitlab explicit"] = step_memory(model, images, device)
            vitlab.set_fused_attention(model, True)
        result["memory"] = memory
    return source, result


def benchmark_vit_pytorch(name: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """vitlab (fused and explicit) against the vit-pytorch model of the same shape
    (vit_pytorch_models.py): not the same model, so no weights are shared; parameters and
    MACs of both come with the speeds."""
    torch.manual_seed(0)
    other = build_vit_pytorch(name).to(device)
    torch.manual_seed(0)
    model = vitlab.create_model(name).eval().to(device)
    size = model.config.img_size
    images = torch.randn(args.batch_size, 3, size, size, generator=torch.Generator().manual_seed(1)).to(device)

    variants: dict[str, Callable[[], object]] = {**vitlab_variants(model, images), "vit-pytorch": lambda: other(images)}
    stats = time_variants(variants, "vit-pytorch", args)
    vitlab.set_fused_attention(model, True)
    shape = (1, 3, size, size)
    info = {
        "params": {"vitlab": count_parameters(model), "vit-pytorch": count_parameters(other)},
        "macs": {"vitlab": count_macs(model, shape), "vit-pytorch": count_macs(other, shape)},
    }
    print(
        f"\n{name} vs vit-pytorch: {size} px, batch {args.batch_size}, {args.runs} runs; params "
        f"{info['params']['vitlab'] / 1e6:.2f}M vs {info['params']['vit-pytorch'] / 1e6:.2f}M, GMACs "
        f"{info['macs']['vitlab'] / 1e9:.3f} vs {info['macs']['vit-pytorch'] / 1e9:.3f}"
    )
    for v, st in stats.items():
        print(
            f"  {v:<15} {st['wall'] * 1e3:9.1f} ms  {args.batch_size / st['wall']:8.2f} img/s  "
            f"paired x{st['paired']:.3f} [{st['paired_low']:.3f}, {st['paired_high']:.3f}] of vit-pytorch"
        )
    return {"stats": stats, **info}


def print_vit_pytorch_table(rows: list[tuple[str, dict[str, Any]]], batch: int) -> None:
    """One markdown row per model: vitlab fused against the vit-pytorch model of the same
    shape; "per MAC" divides out the difference in MACs (GMACs/s of vitlab / of vit-pytorch)."""
    print(f"\nvitlab vs vit-pytorch (same widths, depths and heads; not the same model), batch {batch}:\n")
    print(
        "| model | params vitlab / vit-pytorch (M) | GMACs vitlab / vit-pytorch | vit-pytorch img/s "
        "| vitlab fused img/s | fused / vit-pytorch, paired [95%] | explicit / vit-pytorch, paired [95%] "
        "| fused / vit-pytorch per MAC |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows:
        st, params, macs = r["stats"], r["params"], r["macs"]
        fused, explicit, other = st["vitlab fused"], st["vitlab explicit"], st["vit-pytorch"]
        per_mac = (other["wall"] / fused["wall"]) * (macs["vitlab"] / macs["vit-pytorch"])
        print(
            f"| {name} | {params['vitlab'] / 1e6:.2f} / {params['vit-pytorch'] / 1e6:.2f} "
            f"| {macs['vitlab'] / 1e9:.3f} / {macs['vit-pytorch'] / 1e9:.3f} | {batch / other['wall']:.2f} "
            f"| {batch / fused['wall']:.2f} | {fused['paired']:.3f} [{fused['paired_low']:.3f}, "
            f"{fused['paired_high']:.3f}] | {explicit['paired']:.3f} [{explicit['paired_low']:.3f}, "
            f"{explicit['paired_high']:.3f}] | {per_mac:.3f} |"
        )


def training_step(model: nn.Module, images: torch.Tensor) -> None:
    """Forward, cross-entropy against fixed labels, backward. A model that returns several
    heads in train mode (class and distillation token) gets the sum of their losses."""
    labels = torch.arange(images.shape[0], device=images.device) % 10
    output = model(images)
    heads = output if isinstance(output, (tuple, list)) else (logits_of(output),)
    loss = sum(nn.functional.cross_entropy(head, labels) for head in heads)
    loss.backward()


def step_memory(model: nn.Module, images: torch.Tensor, device: torch.device) -> dict[str, float]:
    """Peak and total bytes allocated during one training step (see the module docstring)."""
    model.train()
    if hasattr(model, "set_distilled_training"):  # timm's LeViT: return both heads, as vitlab's does
        model.set_distilled_training(True)
    model.zero_grad(set_to_none=True)
    training_step(model, images)  # warm-up: lazily created buffers and caches
    model.zero_grad(set_to_none=True)
    try:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            training_step(model, images)
            torch.cuda.synchronize(device)
            return {"peak": torch.cuda.max_memory_allocated(device) - before, "total": float("nan")}
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            training_step(model, images)
        events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        events = sorted((e for e in events if "CPU" in str(e.device_type())), key=lambda e: e.start_ns())
        running = peak = total = 0
        for e in events:
            running += e.nbytes()
            peak = max(peak, running)
            total += max(e.nbytes(), 0)
        return {"peak": peak, "total": total}
    finally:
        model.zero_grad(set_to_none=True)
        if hasattr(model, "set_distilled_training"):
            model.set_distilled_training(False)
        model.eval()


def print_speed_table(rows: list[tuple[str, str, dict[str, dict[str, float]]]], batch: int) -> None:
    """One markdown row per model: images/s of the reference, vitlab fused and vitlab explicit,
    each vitlab path's ratio to the reference (> 1 = vitlab faster), the paired ratio of
    vitlab fused and of the control with their 95% intervals, the control's ratio (the noise
    floor) and the largest spread of any variant's rounds."""
    print(
        "\n| model | reference | reference img/s | vitlab fused img/s | fused / ref | vitlab explicit img/s "
        "| explicit / ref | control / ref | fused / ref, paired [95%] | control / ref, paired [95%] "
        "| max-min / median |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, source, stats in rows:
        ref = stats[source]

        def cells(v: str) -> str:
            if v not in stats:
                return "n/a | n/a"
            return f"{batch / stats[v]['wall']:.2f} | {ref['wall'] / stats[v]['wall']:.3f}"

        def paired(v: str) -> str:
            return f"{stats[v]['paired']:.3f} [{stats[v]['paired_low']:.3f}, {stats[v]['paired_high']:.3f}]"

        fused = "vitlab fused" if "vitlab fused" in stats else "vitlab"
        control = ref["wall"] / stats[f"{source} (control)"]["wall"]
        spread = max(s["spread"] for s in stats.values())
        print(
            f"| {name} | {source} | {batch / ref['wall']:.2f} | {cells(fused)} | {cells('vitlab explicit')} "
            f"| {control:.3f} | {paired(fused)} | {paired(f'{source} (control)')} | {spread:.0%} |"
        )


def print_memory_table(rows: list[tuple[str, str, dict[str, dict[str, float]]]], batch: int, on_cpu: bool) -> None:
    """One markdown row per model: peak memory of one training step, vitlab fused and
    explicit against the reference."""
    method = "torch.profiler, peak of the running sum of allocations" if on_cpu else "torch.cuda.max_memory_allocated"
    print(f"\nPeak memory of one training step, batch {batch} ({method}):\n")
    print(
        "| model | reference | reference peak (MiB) | vitlab fused peak (MiB) | fused / ref "
        "| vitlab explicit peak (MiB) | explicit / ref |"
        + (" reference total alloc (MiB) | vitlab fused total alloc (MiB) |" if on_cpu else "")
    )
    print("|---|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if on_cpu else ""))
    for name, source, memory in rows:
        ref, fused, explicit = memory[source], memory["vitlab"], memory.get("vitlab explicit")
        line = (
            f"| {name} | {source} | {ref['peak'] / 2**20:.1f} | {fused['peak'] / 2**20:.1f} "
            f"| {fused['peak'] / ref['peak']:.3f} | "
        )
        if explicit is None:
            line += "n/a | n/a |"
        else:
            line += f"{explicit['peak'] / 2**20:.1f} | {explicit['peak'] / ref['peak']:.3f} |"
        if on_cpu:
            line += f" {ref['total'] / 2**20:.0f} | {fused['total'] / 2**20:.0f} |"
        print(line)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = vitlab.pick_device() if args.device == "auto" else torch.device(args.device)
    print(describe_machine(device))
    on_cpu = device.type == "cpu"
    rows, memory_rows, vit_pytorch_rows = [], [], []
    for name in args.models:
        if not has_reference(name):
            print(f"\n{name}: neither timm nor HuggingFace has it; see --vit-pytorch")
            continue
        source, stats = benchmark(name, args, device)
        memory = stats.pop("memory", None)
        for v in stats:
            ips = args.batch_size / stats[v]["wall"]
            wall_ratio = stats[source]["wall"] / stats[v]["wall"]
            print(
                f"  {v:<15} {stats[v]['wall'] * 1e3:9.1f} ms  {ips:8.2f} img/s  x{wall_ratio:.3f} of {source}"
                + f"  max-min {stats[v]['spread']:.0%} of median"
                + f"  paired x{stats[v]['paired']:.3f} [{stats[v]['paired_low']:.3f}, {stats[v]['paired_high']:.3f}]"
            )
        rows.append((name, source, stats))
        if memory is not None:
            memory_rows.append((name, source, memory))
            print(
                f"  memory, one training step: vitlab peak {memory['vitlab']['peak'] / 2**20:.0f} MiB, "
                f"{source} peak {memory[source]['peak'] / 2**20:.0f} MiB, "
                f"ratio {memory['vitlab']['peak'] / memory[source]['peak']:.3f}"
            )
    if args.vit_pytorch:
        names = list(VIT_PYTORCH_MODELS) if args.all else [n for n in args.models if n in VIT_PYTORCH_MODELS]
        for name in names:
            vit_pytorch_rows.append((name, benchmark_vit_pytorch(name, args, device)))
    if rows:
        print_speed_table(rows, args.batch_size)
    if memory_rows:
        print_memory_table(memory_rows, args.batch_size, on_cpu)
    if vit_pytorch_rows:
        print_vit_pytorch_table(vit_pytorch_rows, args.batch_size)
    if hasattr(os, "getloadavg"):
        print("\nload average at end (1, 5, 15 min): " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
