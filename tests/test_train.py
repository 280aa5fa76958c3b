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

TINY = dict(img_size=8, patch_size=4, in_chans=1, num_classes=10, embed_dim=32, depth=2, num_heads=2)


def tiny_vit(seed: int = 0, **overrides) -> torch.nn.Module:
    torch.manual_seed(seed)
    return vitlab.create_model("vit_tiny_patch16_224", **{**TINY, **overrides})


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


# Mixed precision, checkpoints and torchrun (issue 29). A tiny ViT on a few digits keeps these fast.


def few_digits(n: int = 256, batch_size: int = 64, augment: bool = False):
    """The first ``n`` training digits in a shuffled loader with its own seeded generator, and a validation loader."""
    from torch.utils.data import DataLoader, Subset

    from vitlab.data import eval_loader

    splits = load_digits(val_fraction=0.15, seed=0, augment=augment)
    generator = torch.Generator().manual_seed(0)
    train = DataLoader(Subset(splits.train, range(n)), batch_size, shuffle=True, generator=generator)
    return train, eval_loader(splits.val)


@pytest.mark.parametrize(
    ("native", "emulated", "expected"),
    [(True, True, torch.bfloat16), (False, True, torch.float16), (False, False, torch.float16)],
    ids=["ampere: bf16", "t4 (sm_75) emulates bf16: fp16", "no bf16: fp16"],
)
def test_bf16_only_where_the_gpu_has_it_natively(monkeypatch, native: bool, emulated: bool, expected) -> None:
    from vitlab.train import amp_dtype

    def is_bf16_supported(including_emulation: bool = True) -> bool:  # torch's signature and default
        return native or (including_emulation and emulated)

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert amp_dtype(torch.device("cuda")) == expected
    assert amp_dtype(torch.device("cpu")) is None  # no autocast on the CPU


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`")
def test_fp16_scaler_skips_a_step_whose_gradients_overflow(monkeypatch) -> None:
    """fp16 autocast and a GradScaler, faked onto the CPU: an inf gradient skips the step
    (no NaN in the weights) and counts in the history."""
    import vitlab.train

    monkeypatch.setattr(vitlab.train, "amp_dtype", lambda device: torch.float16)  # as on a T4
    train, val = few_digits(n=128)
    model = tiny_vit()
    calls = []

    def overflow_once(grad: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return grad * math.inf if len(calls) == 1 else grad

    model.head.weight.register_hook(overflow_once)
    history = fit(model, train, val, TrainConfig(epochs=2, warmup_epochs=0, progress=False))
    assert history.skipped_steps == [1, 0], "the overflowing step is skipped, the others are taken"
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert history.eval_acc[-1] > 0.1


def test_resume_after_an_interruption_ends_as_an_uninterrupted_run(tmp_path, monkeypatch) -> None:
    """Bit for bit: weights, history (but the seconds), best epoch, with Mixup and augmentation
    drawing random numbers and the loader's shuffle continuing where it stopped."""
    import vitlab.train

    config = TrainConfig(epochs=4, warmup_epochs=1, lr=3e-3, mixup_alpha=0.8, keep_best=True, progress=False)
    whole = tiny_vit()
    whole_history = fit(whole, *few_digits(augment=True), dataclasses.replace(config, checkpoint=tmp_path / "a.pt"))

    evaluate_ = vitlab.train.evaluate
    calls = []

    def disconnect_in_epoch_3(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # epoch 3 has trained, its checkpoint is not written yet
            raise KeyboardInterrupt("the Colab session disconnected")
        return evaluate_(*args, **kwargs)

    monkeypatch.setattr(vitlab.train, "evaluate", disconnect_in_epoch_3)
    path = tmp_path / "b.pt"
    with pytest.raises(KeyboardInterrupt):
        fit(tiny_vit(), *few_digits(augment=True), dataclasses.replace(config, checkpoint=path))
    assert torch.load(path, weights_only=True)["epoch"] == 2
    monkeypatch.setattr(vitlab.train, "evaluate", evaluate_)
    resumed = tiny_vit(seed=1)  # a new session: fresh weights and loaders
    history = fit(resumed, *few_digits(augment=True), dataclasses.replace(config, checkpoint=path), resume=True)

    assert history.epoch == [1, 2, 3, 4]
    for key, values in whole_history.as_dict().items():
        if key != "seconds":
            assert getattr(history, key) == values, key
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "b.pt"]  # no temporary file left


def test_the_best_epochs_weights_survive_a_resume(tmp_path, monkeypatch) -> None:
    """keep_best: the best epoch (here the first, by a faked held-out accuracy) comes before the
    interruption; the resumed run must still end with its weights."""
    import vitlab.train

    accuracies = iter([0.9, 0.5, 0.4, 0.9, 0.5, "disconnect", 0.4])

    def held_out(*args, **kwargs):
        accuracy = next(accuracies)
        if accuracy == "disconnect":
            raise KeyboardInterrupt
        return 1.0, accuracy

    monkeypatch.setattr(vitlab.train, "evaluate", held_out)
    config = TrainConfig(epochs=3, warmup_epochs=0, keep_best=True, progress=False)
    whole = tiny_vit()
    fit(whole, *few_digits(n=64), config)
    resumable = dataclasses.replace(config, checkpoint=tmp_path / "run.pt")
    with pytest.raises(KeyboardInterrupt):
        fit(tiny_vit(), *few_digits(n=64), resumable)
    resumed = tiny_vit(seed=1)
    assert fit(resumed, *few_digits(n=64), resumable, resume=True).best_epoch == 1
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)


def test_a_failed_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch) -> None:
    path = tmp_path / "run.pt"
    config = TrainConfig(epochs=2, warmup_epochs=0, progress=False, checkpoint=path)
    save, calls = torch.save, []

    def die_while_writing_epoch_2(obj, file) -> None:
        calls.append(1)
        if len(calls) == 2:
            open(file, "wb").write(b"half a file")
            raise OSError("disk full")
        save(obj, file)

    monkeypatch.setattr(torch, "save", die_while_writing_epoch_2)
    with pytest.raises(OSError, match="disk full"):
        fit(tiny_vit(), *few_digits(n=64), config)
    assert torch.load(path, weights_only=True)["epoch"] == 1


@pytest.mark.parametrize(
    ("model_overrides", "train_overrides", "names"),
    [
        ({"embed_dim": 16}, {}, ("embed_dim=32", "embed_dim=16")),
        ({}, {"lr": 5e-4}, ("'lr': 0.001", "'lr': 0.0005")),
    ],
    ids=["another model", "another recipe"],
)
def test_a_checkpoint_from_another_run_is_refused(tmp_path, model_overrides, train_overrides, names) -> None:
    config = TrainConfig(epochs=2, warmup_epochs=0, progress=False, checkpoint=tmp_path / "run.pt")
    train, val = few_digits(n=64)
    fit(tiny_vit(), train, val, config)
    with pytest.raises(ValueError, match="is from another run") as error:
        fit(tiny_vit(**model_overrides), train, val, dataclasses.replace(config, **train_overrides), resume=True)
    assert all(name in str(error.value) for name in names), str(error.value)


def test_resume_needs_a_checkpoint_file() -> None:
    with pytest.raises(ValueError, match=r"resume=True needs a file to resume from: TrainConfig\(checkpoint=...\)"):
        fit(tiny_vit(), *few_digits(n=64), TrainConfig(epochs=1, warmup_epochs=0, progress=False), resume=True)


@pytest.mark.parametrize(
    ("cuda", "local_rank", "expected"),
    [(False, "1", "cpu"), (True, None, "cuda"), (True, "0", "cuda:0"), (True, "1", "cuda:1")],
    ids=["no gpu: cpu", "one process: cuda", "torchrun rank 0", "torchrun rank 1"],
)
def test_each_torchrun_process_picks_its_own_gpu(monkeypatch, cuda: bool, local_rank: str | None, expected) -> None:
    """Faked: two GPUs (or none), and the ``LOCAL_RANK`` torchrun gives each process."""
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2 if cuda else 0)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert vitlab.pick_device() == torch.device(expected)
    assert current == ([int(local_rank)] if cuda and local_rank else []), "the current device is this process's GPU"


def test_more_torchrun_processes_than_gpus_is_an_error(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK is 2 but this machine has 2 GPU\(s\): run at most 2 processes"):
        vitlab.pick_device()


def load_train_ddp():
    """benchmarks/train_ddp.py as a module (benchmarks/ is not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / "train_ddp.py"
    spec = importlib.util.spec_from_file_location("train_ddp", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_torchrun_with_two_processes_matches_one_process_with_the_same_global_batch(tmp_path) -> None:
    """``torchrun --nproc_per_node 2`` on the CPU (gloo), 2 x 32 images a step, against one
    process with batches of 64 drawn in the same order (a DistributedSampler of one)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from torch.utils.data import DataLoader, DistributedSampler

    options = ["--epochs", "2", "--embed-dim", "32", "--depth", "2", "--train-size", "512"]
    torchrun = Path(sys.executable).parent / "torchrun"
    # On the CPU with gloo on any machine: with one GPU, a second process would find no GPU of its own.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "CUDA_VISIBLE_DEVICES": ""}
    script = Path(__file__).parents[1] / "benchmarks" / "train_ddp.py"
    run = subprocess.run(
        [str(torchrun), "--nproc_per_node", "2", str(script), *options, "--batch-size", "32"]
        + ["--checkpoint", str(tmp_path / "ddp.pt")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("2 process(es), global batch 64") == 1, run.stdout  # rank 0 alone prints
    assert [p.name for p in tmp_path.iterdir()] == ["ddp.pt"]
    ddp = torch.load(tmp_path / "ddp.pt", weights_only=True)
    assert ddp["epoch"] == 2

    train_ddp = load_train_ddp()
    model, train, val, config = train_ddp.build(train_ddp.parse_args([*options, "--batch-size", "64"]))
    sampler = DistributedSampler(train.dataset, num_replicas=1, rank=0, shuffle=True, seed=config.seed)
    history = fit(model, DataLoader(train.dataset, 64, sampler=sampler), val, config)
    assert ddp["history"]["eval_acc"] == pytest.approx(history.eval_acc, abs=1.5 / 216)  # at most one image apart
    for name, weight in model.state_dict().items():
        torch.testing.assert_close(ddp["model"][name], weight, atol=1e-5, rtol=1e-4, msg=name)
