"""vitlab.data: digits offline, CIFAR-10 read from a small fabricated copy in CIFAR's own
on-disk format (no download), seeded loaders, and clear errors."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from vitlab.data import (
    CIFAR10_CLASSES,
    CIFAR10_FOLDER,
    RandomShift,
    TensorImageDataset,
    load_cifar10,
    load_digits,
    make_loaders,
)


def test_digits_split_shapes_and_standardisation() -> None:
    splits = load_digits()
    assert (len(splits.train), len(splits.test)) == (1437, 360)  # 1,797 images, 20% held out
    image, label = splits.train[0]
    assert image.shape == (1, 8, 8) and image.dtype == torch.float32 and label.dtype == torch.int64
    assert (splits.in_chans, splits.image_size, splits.num_classes) == (1, 8, 10)
    train_images = splits.train.images
    assert abs(train_images.mean().item()) < 1e-5 and abs(train_images.std().item() - 1) < 1e-5


def test_digits_split_is_stratified_and_disjoint() -> None:
    splits = load_digits()
    counts = torch.bincount(splits.test.labels, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # ~36 of each digit
    train = {tuple(x.flatten().tolist()) for x in splits.train.images}
    overlap = sum(tuple(x.flatten().tolist()) in train for x in splits.test.images)
    assert overlap <= 5  # sklearn's digits hold a few duplicate images, no more


def test_digits_split_depends_on_seed_only() -> None:
    a, b, c = load_digits(seed=0), load_digits(seed=0), load_digits(seed=1)
    assert torch.equal(a.test.labels, b.test.labels) and torch.equal(a.test.images, b.test.images)
    assert not torch.equal(a.test.images, c.test.images)


def test_digits_augmentation_only_on_the_training_set() -> None:
    splits = load_digits(augment=True)
    assert isinstance(splits.train.transform, RandomShift) and splits.test.transform is None


def test_random_shift_moves_content_and_fills_with_background() -> None:
    image = torch.zeros(1, 5, 5)
    image[0, 2, 2] = 1.0
    torch.manual_seed(0)
    shifted = [RandomShift(1)(image) for _ in range(50)]
    positions = {tuple((s[0] == 1).nonzero()[0].tolist()) for s in shifted}
    assert positions <= {(r, c) for r in (1, 2, 3) for c in (1, 2, 3)} and len(positions) > 3
    assert all(s.shape == image.shape and s.sum() == 1 for s in shifted)
    with pytest.raises(ValueError, match="max_shift must be an int >= 0, got -1"):
        RandomShift(-1)


@pytest.mark.parametrize("fraction", [0.0, 1.0, 1.5])
def test_digits_bad_test_fraction(fraction: float) -> None:
    with pytest.raises(ValueError, match=rf"test_fraction must be in \(0, 1\), got {fraction}"):
        load_digits(test_fraction=fraction)


def test_digits_upsampled_for_larger_stems() -> None:
    small, large = load_digits(), load_digits(image_size=32)
    image, _ = large.train[0]
    assert image.shape == (1, 32, 32) and large.image_size == 32 and large.in_chans == 1
    assert torch.equal(small.train.labels, large.train.labels)  # the same split
    train_images = large.train.images  # standardised after resizing, with training statistics
    assert abs(train_images.mean().item()) < 1e-5 and abs(train_images.std().item() - 1) < 1e-5
    # Bilinear with align_corners=False: shrinking back by 4 (mean over 4x4 blocks) gives a
    # smoothed copy of the original, so the 8x8 image is recognisably the same.
    down = torch.nn.functional.avg_pool2d(large.test.images, 4)
    corr = torch.corrcoef(torch.stack([down.flatten(), small.test.images.flatten()]))[0, 1]
    assert corr > 0.95


@pytest.mark.parametrize("size", [4, 7, 16.0, True])
def test_digits_bad_image_size(size: object) -> None:
    with pytest.raises(ValueError, match=rf"image_size must be an int >= 8 .*got {size!r}"):
        load_digits(image_size=size)


def test_tensor_image_dataset_rejects_mismatched_tensors() -> None:
    with pytest.raises(ValueError, match=r"expected images \(N, C, H, W\) and labels \(N,\), got \(4, 8, 8\)"):
        TensorImageDataset(torch.zeros(4, 8, 8), torch.zeros(4))


def test_loaders_are_seeded() -> None:
    splits = load_digits()
    first = [next(iter(make_loaders(splits, batch_size=16, seed=s)[0]))[1] for s in (3, 3, 4)]
    assert torch.equal(first[0], first[1]) and not torch.equal(first[0], first[2])
    _, test = make_loaders(splits, batch_size=16)
    assert torch.equal(next(iter(test))[1], splits.test.labels[:256])  # test set in order
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        make_loaders(splits, batch_size=0)


# --- CIFAR-10, from a fabricated copy in the format torchvision reads -----------------------

PER_TRAIN_BATCH, TEST_SIZE = 4, 6


def _write_batch(path: Path, rng: np.random.Generator, n: int) -> None:
    entry = {"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8), "labels": rng.integers(0, 10, n).tolist()}
    path.write_bytes(pickle.dumps(entry))


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_cifar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """CIFAR-10's python layout (five data batches, a test batch, batches.meta) with random
    pixels. torchvision checks every file's MD5 against the real dataset's; the test points
    those checksums at the fabricated files, so torchvision's own reading code runs unchanged."""
    from torchvision.datasets import CIFAR10

    folder = tmp_path / CIFAR10_FOLDER
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, _ in CIFAR10.train_list:
        _write_batch(folder / name, rng, PER_TRAIN_BATCH)
    _write_batch(folder / "test_batch", rng, TEST_SIZE)
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": list(CIFAR10_CLASSES)}))
    monkeypatch.setattr(CIFAR10, "train_list", [[n, _md5(folder / n)] for n, _ in CIFAR10.train_list])
    monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", _md5(folder / "test_batch")]])
    monkeypatch.setattr(CIFAR10, "meta", {**CIFAR10.meta, "md5": _md5(folder / "batches.meta")})
    return tmp_path


def test_cifar10_reads_the_on_disk_format(fake_cifar: Path) -> None:
    splits = load_cifar10(fake_cifar, augment=False)
    assert (len(splits.train), len(splits.test)) == (5 * PER_TRAIN_BATCH, TEST_SIZE)
    assert (splits.in_chans, splits.image_size, splits.class_names) == (3, 32, CIFAR10_CLASSES)
    image, label = splits.test[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and 0 <= label < 10
    raw = splits.test.data[0]  # (32, 32, 3) uint8, as stored
    expected = (torch.tensor(raw).permute(2, 0, 1) / 255 - torch.tensor([0.4914, 0.4822, 0.4465])[:, None, None]) / (
        torch.tensor([0.2470, 0.2435, 0.2616])[:, None, None]
    )
    torch.testing.assert_close(image, expected)
    train, _ = make_loaders(splits, batch_size=8)
    images, labels = next(iter(train))
    assert images.shape == (8, 3, 32, 32) and labels.shape == (8,)


def test_cifar10_training_augmentation(fake_cifar: Path) -> None:
    splits = load_cifar10(fake_cifar)
    names = [type(t).__name__ for t in splits.train.transform.transforms]
    assert names == ["RandomCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"]
    assert [type(t).__name__ for t in splits.test.transform.transforms] == ["ToTensor", "Normalize"]


def test_cifar10_missing_dataset_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=rf"expected the folder .*{CIFAR10_FOLDER}.*download=True"):
        load_cifar10(tmp_path)


def test_cifar10_root_that_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "cifar.tar.gz"
    file.write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="CIFAR-10 root must be a folder, got the file"):
        load_cifar10(file)


def test_cifar10_corrupt_files(fake_cifar: Path) -> None:
    (fake_cifar / CIFAR10_FOLDER / "data_batch_3").write_bytes(b"truncated")
    with pytest.raises(RuntimeError, match="incomplete or corrupt"):
        load_cifar10(fake_cifar)


def test_a_validation_split_comes_out_of_the_training_images_only() -> None:
    plain = load_digits(seed=0)
    with_val = load_digits(seed=0, val_fraction=0.15)
    assert plain.val is None
    assert with_val.val is not None
    assert len(with_val.train) + len(with_val.val) == len(plain.train)
    assert len(with_val.test) == len(plain.test)
    # the same test images (standardised with other statistics, so compare the labels' order
    # and the pixels' ranks) and no image in two splits
    assert torch.equal(with_val.test.labels, plain.test.labels)  # type: ignore[attr-defined]
    val_labels = with_val.val.labels  # type: ignore[attr-defined]
    assert torch.bincount(val_labels, minlength=10).min() >= 18, "stratified: every class in the validation split"
    train_x, val_x = with_val.train.images, with_val.val.images  # type: ignore[attr-defined]
    assert not (train_x.flatten(1)[:, None] == val_x.flatten(1)[None]).all(-1).any(), "a validation image in training"
    assert abs(float(train_x.mean())) < 1e-5, "standardised with the (smaller) training split's statistics"
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="val_fraction must be in"):
            load_digits(val_fraction=bad)


def test_eval_loader_is_unshuffled_and_refuses_a_missing_split() -> None:
    from vitlab.data import eval_loader

    splits = load_digits(seed=0, val_fraction=0.15)
    assert splits.val is not None
    labels = torch.cat([y for _, y in eval_loader(splits.val, batch_size=50)])
    assert torch.equal(labels, splits.val.labels)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="val_fraction"):
        eval_loader(load_digits().val)
