"""Safe weight loading: round trips, tampered pickles refused, no unsafe load anywhere in
the repository. Released weights (``create_model(..., pretrained=True)``): test_pretrained.py."""

from __future__ import annotations

import ast
import builtins
import json
import pickle
import sys
from pathlib import Path

import pytest
import torch

import vitlab
from conftest import perturb_, random_images
from vitlab.weights import load_checkpoint, load_state_dict, save_state_dict

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = [".pt", ".safetensors"]
# Calls that unpickle a file, and where the repository may contain them.
PICKLE_LOADERS = {"load", "load_state_dict_from_url"}
SCANNED = ["vitlab", "tests", "notebooks", "benchmarks"]
ALLOW = "# unsafe on purpose"


class Payload:
    """Unpickling this object runs ``exec``: it creates ``marker``, standing in for an attack."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",)


def tampered(tmp_path: Path, hidden: bool) -> tuple[Path, Path]:
    """A .pt file whose pickle runs code, on its own or hidden in a real state dict."""
    marker, path = tmp_path / "marker", tmp_path / "tampered.pt"
    payload = Payload(marker)
    torch.save({"weight": torch.ones(2), "bias": payload} if hidden else payload, path)
    return path, marker


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_round_trip_gives_identical_logits(tmp_path: Path, suffix: str) -> None:
    model = perturb_(vitlab.create_model("vit_tiny_patch16_224", depth=2).eval())
    save_state_dict(model, tmp_path / f"weights{suffix}")
    loaded = load_checkpoint(vitlab.create_model("vit_tiny_patch16_224", depth=2).eval(), tmp_path / f"weights{suffix}")
    images = random_images(1)
    with torch.no_grad():
        assert torch.equal(loaded(images), model(images))


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_round_trip_keeps_every_tensor(tmp_path: Path, suffix: str) -> None:
    # LeViT brings BatchNorm statistics and integer index buffers along: values and dtypes.
    state_dict = perturb_(vitlab.create_model("levit_128s")).state_dict()
    save_state_dict(state_dict, tmp_path / f"weights{suffix}")
    loaded = load_state_dict(tmp_path / f"weights{suffix}")
    assert sorted(loaded) == sorted(state_dict)
    changed = [k for k, v in state_dict.items() if loaded[k].dtype != v.dtype or not torch.equal(loaded[k], v)]
    assert not changed, f"tensors changed by the round trip: {changed[:5]}"


def test_safetensors_stores_tensors_that_share_memory(tmp_path: Path) -> None:
    base = torch.arange(6.0)
    save_state_dict({"a": base, "b": base[:3], "c": base.view(2, 3)}, tmp_path / "shared.safetensors")
    loaded = load_state_dict(tmp_path / "shared.safetensors")
    assert torch.equal(loaded["b"], base[:3]) and torch.equal(loaded["c"], base.view(2, 3))


def test_wrapped_training_checkpoint_is_unwrapped(tmp_path: Path) -> None:
    state_dict = {"weight": torch.randn(3, 2)}
    torch.save({"model": state_dict, "epoch": 3}, tmp_path / "deit_style.pth")  # DeiT's release format
    assert torch.equal(load_state_dict(tmp_path / "deit_style.pth")["weight"], state_dict["weight"])


def test_load_checkpoint_is_strict(tmp_path: Path) -> None:
    model = vitlab.create_model("vit_tiny_patch16_224", depth=1)
    state_dict = model.state_dict()
    del state_dict["norm.weight"]
    save_state_dict(state_dict, tmp_path / "partial.pt")
    with pytest.raises(RuntimeError, match="Missing key.*norm.weight"):
        load_checkpoint(model, tmp_path / "partial.pt")


# ---------------------------------------------------------------- refused files


@pytest.mark.parametrize("hidden", [False, True], ids=["payload", "payload-in-state-dict"])
def test_tampered_pickle_is_refused_and_runs_nothing(tmp_path: Path, hidden: bool) -> None:
    path, marker = tampered(tmp_path, hidden)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_state_dict(path)
    assert not marker.exists(), "the payload ran"


def test_the_tampered_pickle_is_a_real_attack(tmp_path: Path) -> None:
    # Control: without weights_only the same file runs its code, so the test above can fail.
    path, marker = tampered(tmp_path, hidden=False)
    torch.load(path, weights_only=False)  # unsafe on purpose
    assert marker.exists()


@pytest.mark.parametrize(
    "payload, message",
    [
        (torch.zeros(3), "holds a Tensor, expected a state dict"),
        ([torch.zeros(3)], "holds a list, expected a state dict"),
        ({"weight": torch.zeros(3), "epoch": 3}, "'epoch' is a int, expected a Tensor"),
        ({0: torch.zeros(3)}, "key 0 is a int, expected a str"),
    ],
    ids=["tensor", "list", "non-tensor-value", "non-str-key"],
)
def test_non_state_dict_is_rejected(tmp_path: Path, payload: object, message: str) -> None:
    torch.save(payload, tmp_path / "odd.pt")
    with pytest.raises(TypeError, match=message):
        load_state_dict(tmp_path / "odd.pt")


def test_safetensors_missing_gives_an_install_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "safetensors", None)  # `import safetensors` now fails
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ImportError, match="pip install safetensors"):
        load_state_dict(tmp_path / "weights.safetensors")


# ---------------------------------------------------------------- the repository


def unsafe_loads(code: str) -> list[int]:
    """Lines of ``torch.load``-like calls without ``weights_only=True`` (and no ALLOW comment)."""
    lines = code.splitlines()
    found = []
    for node in ast.walk(ast.parse(code)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in PICKLE_LOADERS or ast.unparse(node.func.value) not in {"torch", "torch.hub"}:
            continue
        safe = any(k.arg == "weights_only" and getattr(k.value, "value", None) is True for k in node.keywords)
        if not safe and ALLOW not in lines[node.lineno - 1]:
            found.append(node.lineno)
    return found


def test_every_torch_load_in_the_repository_is_weights_only() -> None:
    offenders = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            offenders += [f"{path.relative_to(ROOT)}:{n}" for n in unsafe_loads(path.read_text(encoding="utf-8"))]
        for path in sorted((ROOT / folder).rglob("*.ipynb")):
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
            for number, cell in enumerate(cells):
                code = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
                code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
                offenders += [f"{path.relative_to(ROOT)} cell {number}" for _ in unsafe_loads(code)]
    assert not offenders, f"torch.load without weights_only=True: {offenders}"
    # The scanner itself: it must see the deliberate unsafe call in this file, were it not allowed.
    assert unsafe_loads("torch.load(path, weights_only=False)") == [1]
    assert unsafe_loads("import torch\ntorch.load(path)") == [2]
    assert unsafe_loads("torch.load(path, map_location='cpu', weights_only=True)") == []
