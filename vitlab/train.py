"""A small, readable training loop for the course's models.

The recipe is the one DeiT made standard for ViTs, cut down to what a small model on a
small dataset needs: AdamW with no weight decay on biases, norms, tokens and position
embeddings; a linear warmup then a cosine decay, updated every step; label smoothing;
optional mixup (off by default); gradient clipping; mixed precision on a CUDA GPU only.

``fit`` measures the model on a held-out loader after every epoch: a **validation**
split while you choose hyperparameters or the epoch to keep (``keep_best=True`` restores
the weights of the epoch with the best held-out accuracy), and the test split only once, at
the very end, with :func:`evaluate`.

``fit`` seeds PyTorch's global generator with ``config.seed`` before it starts (dropout,
drop path and mixup draw from it) and the caller's training loader should carry its own
seeded generator (``vitlab.data.make_loaders`` does): then two runs on the CPU give the
same history, number for number.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader

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


def _autocast(device: torch.device, enabled: bool):
    """bf16 autocast on a CUDA GPU that supports it, fp16 otherwise; nothing on the CPU."""
    use = enabled and device.type == "cuda"
    dtype = torch.bfloat16 if use and torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=use)


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, *, amp: bool = True) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` (put in eval mode) over ``loader``."""
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
    if count == 0:
        raise ValueError("evaluate got an empty loader")
    return loss_sum / count, correct / count


def fit(model: nn.Module, train_loader: DataLoader, eval_loader: Iterable, config: TrainConfig) -> History:
    """Train ``model`` (already on its device) for ``config.epochs`` epochs; measure it on ``eval_loader`` after each.

    ``eval_loader`` is held-out data: a validation split to choose hyperparameters and the
    epoch (``config.keep_best``), or, once the choices are made, the test split.

    Returns:
        The :class:`History` of the run. The model is left trained, in eval mode, with the
        last epoch's weights, or those of ``history.best_epoch`` when ``config.keep_best``.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a vitlab.train.TrainConfig, got {type(config).__name__}")
    if len(train_loader) == 0:
        raise ValueError("train_loader is empty")
    torch.manual_seed(config.seed)
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(parameter_groups(model, config.weight_decay), lr=config.lr)
    steps_per_epoch = len(train_loader)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: warmup_cosine(
            step,
            total_steps=config.epochs * steps_per_epoch,
            warmup_steps=config.warmup_epochs * steps_per_epoch,
            min_ratio=config.min_lr_ratio,
        ),
    )
    use_fp16 = config.amp and device.type == "cuda" and not torch.cuda.is_bf16_supported()
    scaler = torch.amp.GradScaler(device.type, enabled=use_fp16)
    history = History()
    best_state: dict[str, Tensor] | None = None  # the best epoch's weights (keep_best)
    epochs: Any = range(1, config.epochs + 1)  # a tqdm bar over it with config.progress
    if config.progress:
        from tqdm.auto import tqdm

        epochs = tqdm(epochs, desc="epochs", unit="epoch")
    for epoch in epochs:
        start = time.perf_counter()
        model.train()
        loss_sum, correct, count = 0.0, 0, 0
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
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            loss_sum += loss.item() * labels.numel()
            correct += (logits.argmax(-1) == labels).sum().item()
            count += labels.numel()
        eval_loss, eval_acc = evaluate(model, eval_loader, amp=config.amp)
        if config.keep_best and (not history.eval_acc or eval_acc > max(history.eval_acc)):
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        history.epoch.append(epoch)
        history.lr.append(optimizer.param_groups[0]["lr"])
        history.train_loss.append(loss_sum / count)
        history.train_acc.append(correct / count)
        history.eval_loss.append(eval_loss)
        history.eval_acc.append(eval_acc)
        history.seconds.append(time.perf_counter() - start)
        if config.progress:
            epochs.set_postfix(loss=f"{loss_sum / count:.3f}", eval_acc=f"{eval_acc:.3f}")
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return history
