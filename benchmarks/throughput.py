"""Inference throughput of vitlab against timm, same config and same weights, one process.

For every model, timm's randomly initialised weights are converted into the vitlab model
(``vitlab.convert_state_dict``) and the logits are checked to agree before anything is
timed. Then four variants run in alternation, one forward pass of ``--batch-size`` images
each, round after round (the starting variant rotates every round, so no variant always
runs first after another one heated the caches):

* ``vitlab explicit``: vitlab with ``softmax(q k^T * scale) v`` written out;
* ``vitlab fused``: vitlab with ``F.scaled_dot_product_attention``;
* ``timm``: timm's ``VisionTransformer`` (fused attention, timm's default);
* ``timm (control)``: the same timm model timed again as if it were a fourth variant.
  Its ratio to ``timm`` should be 1; how far it is from 1 is the noise floor of the run.

Reported: the median wall-clock time of ``--runs`` passes per variant, as images/s, and
the ratio to timm (> 1 means vitlab is faster). On a shared machine other processes steal
wall-clock time unevenly, so the ratio of the median *process CPU time* is printed too
(CPU only; on CUDA it measures the host side and is left out). fp32, eval mode,
``torch.inference_mode()``.

Usage::

    python benchmarks/throughput.py                          # ViT-S/16 and ViT-B/16, batch 8
    python benchmarks/throughput.py --threads 2 --runs 9
    python benchmarks/throughput.py --models vit_tiny_patch16_224 --device cpu
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

import vitlab

DEFAULT_MODELS = ("vit_small_patch16_224", "vit_base_patch16_224")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="timm/vitlab model names")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--runs", type=int, default=7, help="timed forward passes per variant (>= 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed passes per variant first")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--device", default="auto", help="'auto' (cuda when present), 'cpu' or 'cuda'")
    args = parser.parse_args(argv)
    if args.runs < 5:
        parser.error(f"--runs must be at least 5 for a meaningful median, got {args.runs}")
    if args.batch_size < 1 or args.warmup < 0:
        parser.error(f"need --batch-size >= 1 and --warmup >= 0, got {args.batch_size} and {args.warmup}")
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

    lines = [
        f"cpu: {cpu_name()}, os.cpu_count()={os.cpu_count()}, torch threads={torch.get_num_threads()}",
        f"python {platform.python_version()}, torch {torch.__version__}, timm {timm.__version__}",
        f"device: {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
    ]
    return "\n".join(lines)


def build_pair(name: str, device: torch.device) -> tuple[nn.Module, nn.Module, float]:
    """timm model and a vitlab model carrying its weights; max |logit difference|."""
    import timm

    torch.manual_seed(0)
    reference = timm.create_model(name, pretrained=False).eval()
    model = vitlab.create_model(name).eval()
    model.load_state_dict(vitlab.convert_state_dict(name, reference.state_dict(), "timm"), strict=True)
    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        diff = (model(images) - reference(images)).abs().max().item()
    return model.to(device), reference.to(device), diff


def time_once(fn: Callable[[], torch.Tensor], device: torch.device) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of one call."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - wall, time.process_time() - cpu


def benchmark(name: str, args: argparse.Namespace, device: torch.device) -> dict[str, dict[str, float]]:
    """Per variant: median wall and CPU seconds per forward pass, and the wall spread."""
    model, reference, diff = build_pair(name, device)
    if diff > 1e-4:
        raise RuntimeError(f"{name}: vitlab and timm logits differ by {diff:.2e} (expected <= 1e-4)")
    images = torch.randn(args.batch_size, 3, 224, 224, generator=torch.Generator().manual_seed(1)).to(device)

    def vitlab_with(fused: bool) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            vitlab.set_fused_attention(model, fused)  # a Python attribute flip: costs nothing
            return model(images)

        return run

    variants = {
        "vitlab explicit": vitlab_with(False),
        "vitlab fused": vitlab_with(True),
        "timm": lambda: reference(images),
        "timm (control)": lambda: reference(images),
    }
    names = list(variants)
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in names}
    with torch.inference_mode():
        for _ in range(args.warmup):
            for v in names:
                variants[v]()
        for r in range(args.runs):
            order = names[r % len(names) :] + names[: r % len(names)]  # rotate the start
            for v in order:
                times[v].append(time_once(variants[v], device))
    print(f"\n{name}: batch {args.batch_size}, {args.runs} runs, max |logit diff| vs timm {diff:.1e}")
    result = {}
    for v, ts in times.items():
        walls = [w for w, _ in ts]
        wall = statistics.median(walls)
        cpu = statistics.median(c for _, c in ts)
        result[v] = {"wall": wall, "cpu": cpu, "spread": (max(walls) - min(walls)) / wall}
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = vitlab.pick_device() if args.device == "auto" else torch.device(args.device)
    print(describe_machine(device))
    on_cpu = device.type == "cpu"
    rows = []
    for name in args.models:
        stats = benchmark(name, args, device)
        for v in stats:
            ips = args.batch_size / stats[v]["wall"]
            wall_ratio = stats["timm"]["wall"] / stats[v]["wall"]
            cpu_ratio = stats["timm"]["cpu"] / stats[v]["cpu"] if on_cpu else float("nan")
            print(f"  {v:<15} {stats[v]['wall'] * 1e3:9.1f} ms  {ips:8.2f} img/s  x{wall_ratio:.3f} of timm"
                  + (f" (CPU time x{cpu_ratio:.3f})" if on_cpu else "")
                  + f"  max-min {stats[v]['spread']:.0%} of median")
            rows.append((name, v, ips, wall_ratio, cpu_ratio))
    print("\n| model | variant | images/s | vs timm (wall) | vs timm (CPU time) |\n|---|---|---:|---:|---:|")
    for name, v, ips, wall_ratio, cpu_ratio in rows:
        cpu_cell = f"{cpu_ratio:.3f}" if on_cpu else "n/a"
        print(f"| {name} | {v} | {ips:.2f} | {wall_ratio:.3f} | {cpu_cell} |")


if __name__ == "__main__":
    main()
