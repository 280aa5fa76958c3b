"""Datasets for the training chapters: scikit-learn's digits (offline, the default) and CIFAR-10.

The 1,797 8x8 digits ship inside scikit-learn (no download); CIFAR-10 comes through
torchvision (about 170 MB, meant for Colab with a GPU). Both give a :class:`DatasetSplits`;
``make_loaders`` turns it into seeded ``DataLoader``s (the same batches on every run).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

# Channel statistics of the CIFAR-10 training set (the values torchvision's examples use).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_FOLDER = "cifar-10-batches-py"  # what torchvision's CIFAR10 reads under its root


@dataclass(frozen=True)
class DatasetSplits:
    """Train, test and (optional) validation sets of ``(image (C, H, W), label)``, and the
    image format a model must be built for."""

    train: Dataset
    test: Dataset
    in_chans: int
    image_size: int
    class_names: tuple[str, ...]
    val: Dataset | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


class RandomShift:
    """Shift an image by up to ``max_shift`` pixels each way, filling with its smallest value
    (CIFAR's "pad and random crop" for small images); PyTorch's global generator draws.

    Shape: image (C, H, W) -> (C, H, W).
    """

    def __init__(self, max_shift: int = 1) -> None:
        if not isinstance(max_shift, int) or max_shift < 0:
            raise ValueError(f"max_shift must be an int >= 0, got {max_shift!r}")
        self.max_shift = max_shift

    def __call__(self, image: Tensor) -> Tensor:
        s = self.max_shift
        if s == 0:
            return image
        _, H, W = image.shape
        padded = torch.nn.functional.pad(image, (s, s, s, s), value=float(image.min()))
        top, left = torch.randint(0, 2 * s + 1, (2,)).tolist()
        return padded[:, top : top + H, left : left + W]

    def __repr__(self) -> str:
        return f"RandomShift(max_shift={self.max_shift})"


class TensorImageDataset(Dataset):
    """Images and labels held in two tensors, with an optional transform of each image.

    Shape: images (N, C, H, W), labels (N,); an item is (image (C, H, W), label).
    """

    def __init__(self, images: Tensor, labels: Tensor, transform=None) -> None:
        if images.ndim != 4 or len(images) != len(labels):
            raise ValueError(
                f"expected images (N, C, H, W) and labels (N,), got {tuple(images.shape)} and {tuple(labels.shape)}"
            )
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image = self.images[index]
        return (self.transform(image) if self.transform else image), self.labels[index]


def load_digits(
    *, test_fraction: float = 0.2, val_fraction: float = 0.0, seed: int = 0, augment: bool = False,
    image_size: int = 8,
) -> DatasetSplits:  # fmt: skip
    """scikit-learn's handwritten digits as 1x8x8 images (or upsampled), split stratified by class.

    Pixels are standardised with the training images' mean and standard deviation only.

    Args:
        test_fraction: share of the 1,797 images held out for testing, in (0, 1).
        val_fraction: share of the other images held out for validation, in [0, 1); 0 makes
            none (the test split does not depend on it).
        seed: seed of the split.
        augment: shift each training image by up to one pixel (:class:`RandomShift`).
        image_size: side of the returned images; above 8 they are upsampled bilinearly
            before standardisation (chapter 13 uses 32).
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 8:
        raise ValueError(f"image_size must be an int >= 8 (the digits are 8x8; only upsampling), got {image_size!r}")
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    bunch: Any = sklearn_digits()  # a sklearn Bunch (typed as a tuple because of return_X_y)
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1)  # (1797, 1, 8, 8)
    if image_size != 8:
        images = F.interpolate(images, size=(image_size, image_size), mode="bilinear", align_corners=False)
    labels = torch.tensor(bunch.target, dtype=torch.int64)
    train_idx, test_idx = train_test_split(
        torch.arange(len(labels)).numpy(), test_size=test_fraction, random_state=seed, stratify=labels.numpy()
    )
    val_idx = None
    if val_fraction > 0:
        train_idx, val_idx = train_test_split(
            train_idx, test_size=val_fraction, random_state=seed, stratify=labels.numpy()[train_idx]
        )
    train_idx, test_idx = torch.from_numpy(train_idx), torch.from_numpy(test_idx)
    mean, std = images[train_idx].mean(), images[train_idx].std()
    images = (images - mean) / std
    return DatasetSplits(
        train=TensorImageDataset(images[train_idx], labels[train_idx], RandomShift(1) if augment else None),
        test=TensorImageDataset(images[test_idx], labels[test_idx]),
        in_chans=1,
        image_size=image_size,
        class_names=tuple(str(d) for d in range(10)),
        val=None if val_idx is None else TensorImageDataset(images[torch.from_numpy(val_idx)], labels[val_idx]),
    )


def cifar10_transforms(train: bool, augment: bool = True):  # -> torchvision.transforms.Compose
    """Random crop (pad 4) and flip for training, then ``ToTensor`` and per-channel standardisation."""
    from torchvision import transforms as T

    steps = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()] if train and augment else []
    return T.Compose([*steps, T.ToTensor(), T.Normalize(CIFAR10_MEAN, CIFAR10_STD)])


def load_cifar10(root: str | Path, *, download: bool = False, augment: bool = True) -> DatasetSplits:
    """CIFAR-10 (50,000 train / 10,000 test 3x32x32 images) through torchvision.

    ``root`` holds (or will hold) ``cifar-10-batches-py/``; ``download`` fetches it (about
    170 MB); ``augment``: random crop and flip on the training set.
    """
    root = Path(root).expanduser()
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"CIFAR-10 root must be a folder, got the file {root}")
    folder = root / CIFAR10_FOLDER
    if not download and not folder.is_dir():
        raise FileNotFoundError(
            f"CIFAR-10 not found: expected the folder {folder} (torchvision's 'python version' of CIFAR-10). "
            "Pass download=True to fetch it (about 170 MB, needs internet), or point root at the folder "
            f"that contains {CIFAR10_FOLDER}/"
        )
    from torchvision.datasets import CIFAR10

    try:
        train = CIFAR10(str(root), train=True, download=download, transform=cifar10_transforms(True, augment))
        test = CIFAR10(str(root), train=False, download=download, transform=cifar10_transforms(False))
    except RuntimeError as error:  # torchvision: "Dataset not found or corrupted."
        raise RuntimeError(
            f"CIFAR-10 under {folder} is incomplete or corrupt ({error}); delete the folder and "
            "load again with download=True"
        ) from error
    return DatasetSplits(train=train, test=test, in_chans=3, image_size=32, class_names=CIFAR10_CLASSES)


def make_loaders(
    splits: DatasetSplits, *, batch_size: int = 64, seed: int = 0, num_workers: int = 0
) -> tuple[DataLoader, DataLoader]:
    """A shuffled training loader (seeded: the same order every run) and an unshuffled test loader."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    generator = torch.Generator().manual_seed(seed)
    train = DataLoader(splits.train, batch_size=batch_size, shuffle=True, generator=generator, num_workers=num_workers)
    test = eval_loader(splits.test, batch_size=max(batch_size, 256), num_workers=num_workers)
    return train, test


def eval_loader(dataset: Dataset | None, *, batch_size: int = 256, num_workers: int = 0) -> DataLoader:
    """An unshuffled loader for held-out data (a validation or test split)."""
    if dataset is None:
        raise ValueError("no dataset to load: ask for a validation split (e.g. load_digits(val_fraction=0.15))")
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)


def first_batch(dataset: Dataset, n: int) -> tuple[Tensor, Tensor]:
    """The first ``n`` items of ``dataset`` stacked: images (n, C, H, W), labels (n,)."""
    items = [dataset[i] for i in range(min(n, len(dataset)))]  # pyright: ignore[reportArgumentType]
    return torch.stack([x for x, _ in items]), torch.tensor([int(y) for _, y in items])
