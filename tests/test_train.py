"""vitlab.train: the schedule, the weight-decay groups, mixup, determinism on the CPU, and
that a tiny ViT actually learns digits."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import vitlab
from vitlab.data import load_digits, make_loaders
from vitlab.train import History, TrainConfig, evaluate, fit, mixed_loss, mixup, parameter_groups, warmup_cosine


def tiny_vit(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return vitlab.create_model(
        "vit_tiny_patch16_224", img_size=8, patch_size=4, in_chans=1, num_classes=10, embed_dim=32, depth=2, num_heads=2
    )


@pytest.fixture(scope="module")
def digits_loaders():
    return make_loaders(load_digits(), batch_size=64, seed=0)


def test_warmup_then_cosine() -> None:
    lr = [warmup_cosine(s, total_steps=100, warmup_steps=10, min_ratio=0.01) for s in range(101)]
    assert lr[0] == pytest.approx(0.1) and lr[9] == pytest.approx(1.0)  # linear warmup, 1/10 .. 10/10
    assert all(a >= b for a, b in zip(lr[10:], lr[11:]))  # then never rises
    assert lr[55] == pytest.approx(0.01 + 0.99 * 0.5)  # halfway through the cosine
    assert lr[100] == pytest.approx(0.01)
    assert warmup_cosine(0, total_steps=10, warmup_steps=0) == pytest.approx(1.0)


def test_no_weight_decay_on_biases_norms_tokens_and_position_embedding() -> None:
    model = tiny_vit()
    decay, no_decay = parameter_groups(model, 0.05)
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    skipped = {names[id(p)] for p in no_decay["params"]}
    assert {"cls_token", "pos_embed", "norm.weight", "norm.bias", "head.bias"} <= skipped
    assert all(names[id(p)].endswith("weight") and p.ndim >= 2 for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_mixup_mixes_images_and_the_loss_alike() -> None:
    torch.manual_seed(0)
    images, labels = torch.randn(6, 1, 8, 8), torch.arange(6)
    mixed, labels_a, labels_b, lam = mixup(images, labels, alpha=0.8)
    perm = labels_b  # labels are 0..5, so labels[perm] is perm itself
    torch.testing.assert_close(mixed, lam * images + (1 - lam) * images[perm])
    logits = torch.randn(6, 10)
    soft = lam * F.one_hot(labels_a, 10).float() + (1 - lam) * F.one_hot(labels_b, 10).float()
    torch.testing.assert_close(
        mixed_loss(logits, labels_a, labels_b, lam, 0.1), F.cross_entropy(logits, soft, label_smoothing=0.1)
    )


def test_training_is_deterministic_on_the_cpu(digits_loaders) -> None:
    config = TrainConfig(epochs=2, warmup_epochs=1, progress=False, mixup_alpha=0.8)
    runs = []
    for _ in range(2):
        train, test = make_loaders(load_digits(), batch_size=64, seed=0)
        history = fit(tiny_vit(), train, test, config)
        runs.append({k: v for k, v in history.as_dict().items() if k != "seconds"})
    assert runs[0] == runs[1]


def test_a_tiny_vit_learns_digits(digits_loaders) -> None:
    train, test = digits_loaders
    model = tiny_vit()
    before = evaluate(model, test)[1]
    history = fit(model, train, test, TrainConfig(epochs=4, warmup_epochs=1, lr=3e-3, progress=False))
    assert isinstance(history, History) and history.epoch == [1, 2, 3, 4]
    assert before < 0.2 and history.eval_acc[-1] > 0.6  # chance is 0.1; 4 short epochs are enough for this
    assert history.train_loss[-1] < history.train_loss[0]
    assert not model.training
    assert len(history.seconds) == 4 and history.total_seconds > 0
    peak = history.lr.index(max(history.lr))
    assert peak == 0 and math.isclose(history.lr[-1], 3e-3 * 0.01, rel_tol=1e-6)


def test_a_distilled_deit_trains_on_its_averaged_heads(digits_loaders) -> None:
    train, test = digits_loaders
    torch.manual_seed(0)
    model = vitlab.create_model(
        "deit_tiny_distilled_patch16_224",
        img_size=8,
        patch_size=4,
        in_chans=1,
        num_classes=10,
        embed_dim=32,
        depth=1,
        num_heads=2,
    )
    history = fit(model, train, test, TrainConfig(epochs=1, warmup_epochs=0, progress=False))
    assert 0.0 <= history.eval_acc[0] <= 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epochs": 0}, "epochs must be a positive int, got 0"),
        ({"epochs": 3, "warmup_epochs": 3}, r"warmup_epochs must be in \[0, epochs=3\), got 3"),
        ({"lr": 0.0}, "lr must be positive, got 0.0"),
        ({"label_smoothing": 1.0}, r"label_smoothing must be in \[0, 1\), got 1.0"),
        ({"mixup_alpha": -1.0}, "mixup_alpha must be >= 0"),
        ({"min_lr_ratio": 2.0}, r"min_lr_ratio must be in \[0, 1\], got 2.0"),
    ],
)
def test_bad_config(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


def test_fit_rejects_a_plain_dict_config(digits_loaders) -> None:
    train, test = digits_loaders
    with pytest.raises(TypeError, match="config must be a vitlab.train.TrainConfig, got dict"):
        fit(tiny_vit(), train, test, {"epochs": 1})


def test_keep_best_ends_with_the_best_held_out_epochs_weights() -> None:
    from vitlab.data import eval_loader

    splits = load_digits(val_fraction=0.15, seed=0)
    train, _ = make_loaders(splits, batch_size=64, seed=0)
    val = eval_loader(splits.val)
    config = TrainConfig(epochs=5, warmup_epochs=1, lr=3e-3, progress=False, keep_best=True)
    model = tiny_vit()
    history = fit(model, train, val, config)
    best = history.best_epoch
    assert history.eval_acc[best - 1] == max(history.eval_acc)
    assert math.isclose(evaluate(model, val)[1], max(history.eval_acc)), "the model holds the best epoch's weights"
    last = tiny_vit()
    train, _ = make_loaders(splits, batch_size=64, seed=0)  # the same batches again
    fit(last, train, val, dataclasses.replace(config, keep_best=False))
    assert math.isclose(evaluate(last, val)[1], history.eval_acc[-1]), "without keep_best: the last epoch"


def test_best_epoch_takes_the_first_of_equals_and_needs_an_epoch() -> None:
    history = History(epoch=[1, 2, 3], eval_acc=[0.5, 0.9, 0.9])
    assert history.best_epoch == 2
    with pytest.raises(ValueError, match="no epoch has run"):
        _ = History().best_epoch
