"""Train chapter 12's ViT on the digits with ``vitlab.train.fit``, in one process or under torchrun.

One process, then two processes with the same global batch (on a CPU they talk through gloo)::

    .venv/bin/python benchmarks/train_ddp.py --batch-size 64
    .venv/bin/torchrun --nproc_per_node 2 benchmarks/train_ddp.py --batch-size 32

One machine with 8 GPUs, then two such machines (run the command on each, ``--node_rank``
0 on the first, 1 on the second; HOST is the first machine's address)::

    torchrun --nproc_per_node 8 benchmarks/train_ddp.py
    torchrun --nnodes 2 --node_rank 0 --nproc_per_node 8 --rdzv_backend c10d \\
        --rdzv_endpoint HOST:29500 benchmarks/train_ddp.py

torchrun starts the processes and gives each its ``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE``. What this file adds for it is :func:`start`: join the process group; the
process's GPU, ``cuda:LOCAL_RANK``, is ``vitlab.pick_device()``'s. ``fit`` and the model are
the chapter's, unchanged: ``fit`` sees the process group and shards the data itself.
``--batch-size`` is per process.

A script (not ``python -m vitlab.train``) so that ``vitlab.train`` stays the short loop a
student reads, and so that the cost of several processes can be measured here.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Subset

import vitlab
from vitlab.data import eval_loader, load_digits, make_loaders
from vitlab.train import TrainConfig, fit


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--embed-dim", type=int, default=64)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--train-size", type=int, default=None, help="train on the first N training images")
    parser.add_argument("--checkpoint", default=None, help="a file, written after every epoch")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint if it exists")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    return parser.parse_args(argv)


def build(args: argparse.Namespace) -> tuple[nn.Module, DataLoader, DataLoader, TrainConfig]:
    """Chapter 12's model, loaders and recipe (the model on the CPU)."""
    splits = load_digits(test_fraction=0.2, val_fraction=0.15, seed=0)
    train_loader, _ = make_loaders(splits, batch_size=args.batch_size, seed=0)
    if args.train_size is not None:
        subset = Subset(splits.train, range(args.train_size))
        train_loader = DataLoader(subset, args.batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    vitlab.seed_everything(0)
    model = vitlab.create_model(
        "vit_tiny_patch16_224", img_size=8, patch_size=4, in_chans=1, num_classes=10,
        embed_dim=args.embed_dim, depth=args.depth, num_heads=4, pos_embed="sincos",
    )  # fmt: skip
    config = TrainConfig(
        epochs=args.epochs, lr=args.lr, warmup_epochs=min(3, args.epochs - 1), label_smoothing=0.0,
        mixup_alpha=0.0, progress=False, checkpoint=args.checkpoint,
    )  # fmt: skip
    return model, train_loader, eval_loader(splits.val), config


def start() -> torch.device:
    """Join torchrun's process group (if launched by torchrun) and return this process's device:
    ``cuda:LOCAL_RANK`` (``vitlab.pick_device`` makes it the current device) or the CPU."""
    device = vitlab.pick_device()
    if "WORLD_SIZE" in os.environ:  # set by torchrun
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = start()
    world = dist.get_world_size() if dist.is_initialized() else 1
    model, train_loader, val_loader, config = build(args)
    history = fit(model.to(device), train_loader, val_loader, config, resume=args.resume)
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(
            f"{world} process(es), global batch {world * args.batch_size}: "
            f"{history.total_seconds / len(history.seconds):.2f} s per epoch, "
            f"validation accuracy {history.eval_acc[-1]:.3f} after epoch {history.epoch[-1]}"
        )
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
