"""A small, readable training loop for the course's models.

The recipe is the one DeiT made standard for ViTs, cut down to what a small model on a small dataset needs: AdamW
with no weight decay on biases, norms, tokens and position embeddings; a linear warmup then a cosine decay, updated
every step; label smoothing; optional mixup (off by default); gradient clipping; mixed precision on a CUDA GPU only;
a checkpoint after every epoch to resume from; several processes under ``torchrun``.

``fit`` measures the model on a held-out loader after every epoch: a **validation** split
while you choose hyperparameters or the epoch to keep (``keep_best=True``), the test split
only once, at the very end, with :func:`evaluate`. It seeds PyTorch with ``config.seed``
(dropout, drop path and mixup draw from it); with a training loader that carries its own
seeded generator (``vitlab.data.make_loaders``) two runs on the CPU give the same history.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset

# Parameters whose names contain one of these get no weight decay (as in timm's ViTs).
NO_DECAY_NAMES = ("cls_token", "dist_token", "pos_embed", "attention_biases")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Hyperparameters of :func:`fit`. ``lr`` is the peak learning rate after warmup."""

    epochs: int = 30
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_epochs: int = 3
    min_lr_ratio: float = 0.01  # the cosine ends at lr * min_lr_ratio
    label_smoothing: float = 0.1
    mixup_alpha: float = 0.0  # 0 turns mixup off; DeiT uses 0.8 on ImageNet
    grad_clip_norm: float | None = 1.0
    amp: bool = True  # mixed precision, used only when the model is on a CUDA device
    seed: int = 0
    progress: bool = True  # a tqdm bar over the epochs
    keep_best: bool = False  # end with the weights of the epoch with the best held-out accuracy
    checkpoint: str | os.PathLike | None = None  # a file, written after every epoch (rank 0 only)

    def __post_init__(self) -> None:
        if not isinstance(self.epochs, int) or self.epochs < 1:
            raise ValueError(f"epochs must be a positive int, got {self.epochs!r}")
        if not 0 <= self.warmup_epochs < self.epochs:
            raise ValueError(f"warmup_epochs must be in [0, epochs={self.epochs}), got {self.warmup_epochs}")
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.mixup_alpha < 0:
            raise ValueError(f"mixup_alpha must be >= 0 (0 turns mixup off), got {self.mixup_alpha}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")


@dataclass
class History:
    """One entry per epoch. The held-out metrics (``eval_*``: whatever loader ``fit`` was
    given, a validation split or a test split) use plain cross-entropy (no smoothing)."""

    epoch: list[int] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)  # learning rate at the end of the epoch
    train_loss: list[float] = field(default_factory=list)
    train_acc: list[float] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    eval_acc: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # wall time of the epoch (training + held-out)
    skipped_steps: list[int] = field(default_factory=list)  # fp16 steps with inf/NaN gradients, not taken

    def as_dict(self) -> dict[str, list]:
        return asdict(self)

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds)

    @property
    def best_epoch(self) -> int:
        """The epoch (1-based) with the best held-out accuracy; the first one on a tie."""
        if not self.eval_acc:
            raise ValueError("the history is empty: no epoch has run")
        return self.epoch[max(range(len(self.eval_acc)), key=lambda i: (self.eval_acc[i], -i))]


def warmup_cosine(step: int, *, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> float:
    """Learning-rate multiplier at ``step``: linear from 1/warmup to 1 over the warmup, then a
    cosine from 1 down to ``min_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: weight matrices with ``weight_decay``; biases, norm gains, LayerScale,
    tokens, position embeddings and attention-bias tables without."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        skip = param.ndim <= 1 or any(key in name for key in NO_DECAY_NAMES)
        (no_decay if skip else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def mixup(images: Tensor, labels: Tensor, alpha: float) -> tuple[Tensor, Tensor, Tensor, float]:
    """Mix each image with another of the batch: ``lam * x + (1 - lam) * x[perm]``,
    ``lam ~ Beta(alpha, alpha)``. The loss is then mixed the same way,
    ``lam * CE(logits, labels) + (1 - lam) * CE(logits, labels[perm])`` (see :func:`mixed_loss`).

    Shape: images (B, C, H, W), labels (B,) -> mixed images (B, C, H, W), labels (B,),
    labels[perm] (B,), lam.
    """
    lam = float(torch.distributions.Beta(alpha, alpha).sample())
    perm = torch.randperm(images.shape[0]).to(images.device)
    return lam * images + (1 - lam) * images[perm], labels, labels[perm], lam


def mixed_loss(logits: Tensor, labels_a: Tensor, labels_b: Tensor, lam: float, label_smoothing: float) -> Tensor:
    """Cross-entropy against the mixed targets; equal to cross-entropy with the mixed one-hot
    targets, because cross-entropy is linear in its target."""
    loss_a = F.cross_entropy(logits, labels_a, label_smoothing=label_smoothing)
    if lam == 1.0:
        return loss_a
    return lam * loss_a + (1 - lam) * F.cross_entropy(logits, labels_b, label_smoothing=label_smoothing)


def as_logits(output: Tensor | tuple[Tensor, ...]) -> Tensor:
    """A distilled DeiT returns (cls logits, distillation logits) in training: average them,
    as it does at test time. Any other model returns its logits as they are."""
    return torch.stack(output).mean(0) if isinstance(output, tuple) else output


def amp_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``device``: bf16 on a GPU that computes it natively (Ampere,
    sm_80, and later), fp16 on older GPUs such as Colab's T4 (sm_75), which only emulates
    bf16, slowly; ``None`` (no autocast) on the CPU."""
    if device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16


def _autocast(device: torch.device, enabled: bool):
    dtype = amp_dtype(device) if enabled else None
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def _all_reduce(values: list[float], device: torch.device, group: Any = None) -> list[float]:
    """Sum ``values`` over the processes of a torchrun job; unchanged in a single process."""
    if not (dist.is_available() and dist.is_initialized()):
        return values
    totals = torch.tensor(values, dtype=torch.float64, device=device)  # NCCL: this process's GPU; gloo: either
    dist.all_reduce(totals, group=group)
    return totals.tolist()


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, *, amp: bool = True, group: Any = None) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` (put in eval mode) over ``loader``; under
    torchrun, over the images of every process's ``loader`` together."""
    model.eval()
    device = next(model.parameters()).device
    loss_sum, correct, count = 0.0, 0, 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        with _autocast(device, amp):
            logits = as_logits(model(images)).float()
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(-1) == labels).sum().item()
        count += labels.numel()
    loss_sum, correct, count = _all_reduce([loss_sum, correct, count], device, group)
    if count == 0:
        raise ValueError("evaluate got an empty loader")
    return loss_sum / count, correct / count


def _rng_states(loader: DataLoader, device: torch.device) -> dict:
    kind, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)  # type: ignore[misc]
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,  # this process's GPU only
        "numpy": (kind, torch.tensor(key), pos, has_gauss, gauss),  # a tensor: loadable with weights_only
        "python": random.getstate(),
        "loader": loader.generator.get_state() if loader.generator is not None else None,  # the shuffle order
    }


def _set_rng_states(states: dict, loader: DataLoader, device: torch.device) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(states["cuda"], device)
    kind, key, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, key.numpy(), pos, has_gauss, gauss))
    random.setstate(states["python"])
    if states["loader"] is not None and loader.generator is not None:
        loader.generator.set_state(states["loader"])


def _load_checkpoint(path: str | os.PathLike, identity: dict[str, str]) -> dict:
    """The checkpoint at ``path``, refused unless it comes from a run with the same model
    config (preset and overrides) and training settings."""
    # weights_only: tensors and plain types only. On the CPU: RNG states must stay there.
    state = torch.load(path, map_location="cpu", weights_only=True)
    for key, ours in identity.items():
        if state["identity"][key] != ours:
            raise ValueError(
                f"checkpoint {os.fspath(path)} is from another run: its {key} config is {state['identity'][key]}, "
                f"this run's is {ours}. Resume with the same model and TrainConfig, or pass resume=False."
            )
    return state


def fit(
    model: nn.Module,
    train_loader: DataLoader,
    eval_loader: DataLoader,
    config: TrainConfig,
    *,
    resume: bool = False,
    group: Any = None,
) -> History:
    """Train ``model`` (already on its device) for ``config.epochs`` epochs; measure it on ``eval_loader`` after each.

    ``eval_loader`` is held-out data: a validation split to choose hyperparameters and the
    epoch (``config.keep_best``), or, once the choices are made, the test split.

    ``resume=True`` continues from ``config.checkpoint`` if that file exists (else starts
    afresh), to the same weights and history as a run never stopped. Under torchrun (a
    process group is initialised, or ``group`` given) the model is wrapped in
    ``DistributedDataParallel`` and each process trains on its share of every epoch: the
    global batch is the number of processes times ``train_loader.batch_size``. Rank 0 alone
    shows progress and writes the checkpoint.

    Returns:
        The :class:`History` of the run. The model is left trained, in eval mode, with the
        last epoch's weights, or those of ``history.best_epoch`` when ``config.keep_best``.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a vitlab.train.TrainConfig, got {type(config).__name__}")
    if len(train_loader) == 0:
        raise ValueError("train_loader is empty")
    if resume and config.checkpoint is None:
        raise ValueError("resume=True needs a file to resume from: TrainConfig(checkpoint=...)")
    torch.manual_seed(config.seed)
    device = next(model.parameters()).device
    module, distributed = model, group is not None or (dist.is_available() and dist.is_initialized())
    rank = dist.get_rank(group) if distributed else 0
    if distributed:
        world = dist.get_world_size(group)
        model = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                        process_group=group)  # fmt: skip
        if not isinstance(train_loader.sampler, DistributedSampler):  # each process gets its share of the epoch
            sampler = DistributedSampler(train_loader.dataset, world, rank, shuffle=True, seed=config.seed)
            train_loader = DataLoader(train_loader.dataset, train_loader.batch_size, sampler=sampler,
                                      num_workers=train_loader.num_workers)  # fmt: skip
        held_out: Any = eval_loader.dataset
        eval_loader = DataLoader(Subset(held_out, range(rank, len(held_out), world)), eval_loader.batch_size)
    optimizer = torch.optim.AdamW(parameter_groups(module, config.weight_decay), lr=config.lr)
    total, warmup = config.epochs * len(train_loader), config.warmup_epochs * len(train_loader)
    scheduler = torch.optim.lr_scheduler.LambdaLR(  # stepped after every batch
        optimizer,
        lambda step: warmup_cosine(step, total_steps=total, warmup_steps=warmup, min_ratio=config.min_lr_ratio),
    )
    # fp16 needs a scaler: the loss is multiplied before backward so that small gradients do
    # not round to zero, and a step whose gradients overflow (inf/NaN) is skipped.
    scaler = torch.amp.GradScaler(device.type, enabled=config.amp and amp_dtype(device) == torch.float16)
    history = History()
    best_state: dict[str, Tensor] | None = None  # the best epoch's weights (keep_best)
    settings = {k: v for k, v in asdict(config).items() if k not in ("checkpoint", "progress")}
    identity = {"model": repr(getattr(module, "config", type(module).__name__)), "train": repr(settings)}
    first = 1
    if resume and config.checkpoint is not None and os.path.exists(config.checkpoint):
        state = _load_checkpoint(config.checkpoint, identity)
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        history, best_state, first = History(**state["history"]), state["best_state"], state["epoch"] + 1
        _set_rng_states(state["rng"], train_loader, device)
    epochs: Any = range(first, config.epochs + 1)  # a tqdm bar over it with config.progress
    if config.progress and rank == 0:
        from tqdm.auto import tqdm

        epochs = tqdm(epochs, desc="epochs", unit="epoch", initial=first - 1, total=config.epochs)
    for epoch in epochs:
        start = time.perf_counter()
        if isinstance(train_loader.sampler, DistributedSampler):
            train_loader.sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every process
        model.train()
        loss_sum, correct, count, skipped = 0.0, 0, 0, 0
        for images, labels in train_loader:
            images, labels = images.to(device), labels.to(device)
            labels_b, lam = labels, 1.0
            if config.mixup_alpha > 0:
                images, labels, labels_b, lam = mixup(images, labels, config.mixup_alpha)
            with _autocast(device, config.amp):
                logits = as_logits(model(images))
            loss = mixed_loss(logits.float(), labels, labels_b, lam, config.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            if config.grad_clip_norm is not None:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip_norm)
            scale = scaler.get_scale()
            scaler.step(optimizer)  # skipped when a gradient is inf or NaN
            scaler.update()  # ... and then the scale shrinks
            skipped += int(scaler.get_scale() < scale)
            scheduler.step()
            loss_sum += loss.item() * labels.numel()
            correct += (logits.argmax(-1) == labels).sum().item()
            count += labels.numel()
        loss_sum, correct, count = _all_reduce([loss_sum, correct, count], device, group)
        eval_loss, eval_acc = evaluate(module, eval_loader, amp=config.amp, group=group)
        if config.keep_best and (not history.eval_acc or eval_acc > max(history.eval_acc)):
            best_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
        history.epoch.append(epoch)
        history.lr.append(optimizer.param_groups[0]["lr"])
        history.train_loss.append(loss_sum / count)
        history.train_acc.append(correct / count)
        history.eval_loss.append(eval_loss)
        history.eval_acc.append(eval_acc)
        history.seconds.append(time.perf_counter() - start)
        history.skipped_steps.append(skipped)
        if config.checkpoint is not None and rank == 0:
            state = {
                "identity": identity, "epoch": epoch, "model": module.state_dict(),
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(), "best_state": best_state, "history": history.as_dict(),
                "rng": _rng_states(train_loader, device),
            }  # fmt: skip
            temporary = f"{os.fspath(config.checkpoint)}.tmp"
            torch.save(state, temporary)
            os.replace(temporary, config.checkpoint)  # atomic: a disconnect leaves the old file or the new
        if config.progress and rank == 0:
            epochs.set_postfix(loss=f"{loss_sum / count:.3f}", eval_acc=f"{eval_acc:.3f}")
    if best_state is not None:
        module.load_state_dict(best_state)
    module.eval()
    return history
