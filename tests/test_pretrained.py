"""``create_model(name, pretrained=True)`` offline: a fabricated Hugging Face cache.

No test downloads anything, and no test opens a network connection: every test runs with
``socket.socket.connect`` and ``socket.getaddrinfo`` replaced by a fake network that is
down and records each attempt (the ``network`` fixture). Tests build, in a temporary
folder, the cache folder that ``huggingface_hub`` would have written after downloading the
real repository (``models--<org>--<name>/{blobs,refs,snapshots}``, files in ``blobs`` named
by their hash, ``snapshots/<commit>/<file>`` symlinks to them, ``refs/main`` holding the
commit), filled with perturbed random weights, and check that vitlab reads them from the
cache without a connection attempt and gives the logits of the model that wrote them.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import vitlab
from conftest import COMMIT, add_timm_repo, assert_same_logits, perturb_, random_images, write_snapshot
from vitlab import pretrained
from vitlab.family import family_of

timm = pytest.importorskip("timm")
huggingface_hub = pytest.importorskip("huggingface_hub")

# One small model per family with released weights.
TIMM_MODELS = [
    "vit_tiny_patch16_224",
    "deit_tiny_distilled_patch16_224",
    pytest.param("cait_xxs24_224", marks=pytest.mark.slow),  # 26 blocks: the slowest to build and run
    "crossvit_9_240",
    "pit_ti_224",
    "levit_128s",
]
HF_MODEL = "cvt_13"


# ---------------------------------------------------------------- the fabricated cache


def add_cvt_repo(hub_cache: Path, repo_id: str, work: Path) -> torch.nn.Module:
    """A ``microsoft/cvt-13``-shaped repository written by ``save_pretrained`` (config.json,
    model.safetensors) plus the repository's ``preprocessor_config.json``."""
    transformers = pytest.importorskip("transformers")
    info = timm.data.ImageNetInfo()
    id2label = {i: info.index_to_description(i) for i in range(info.num_classes())}
    config = transformers.CvtConfig(num_labels=len(id2label), id2label=id2label)  # HF defaults are CvT-13
    torch.manual_seed(0)
    model = transformers.CvtForImageClassification(config).eval()
    perturb_(model)
    out = work / repo_id.replace("/", "--")
    model.save_pretrained(out)
    processor = {
        "crop_pct": 0.875,
        "do_normalize": True,
        "do_resize": True,
        "feature_extractor_type": "ConvNextFeatureExtractor",
        "image_mean": list(timm.data.IMAGENET_DEFAULT_MEAN),
        "image_std": list(timm.data.IMAGENET_DEFAULT_STD),
        "resample": 3,
        "size": 224,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
    write_snapshot(hub_cache, repo_id, {p.name: p for p in out.iterdir()})
    return model


def use_cache(monkeypatch: pytest.MonkeyPatch, hf_home: Path, offline: bool = True) -> Path:
    """``HF_HOME`` = ``hf_home`` and ``HF_HUB_OFFLINE=1`` (or unset). huggingface_hub reads both
    when it is imported, so its constants are patched too (for this test only). Returns the
    hub cache folder."""
    hub_cache = hf_home / "hub"
    hub_cache.mkdir(parents=True, exist_ok=True)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
    return hub_cache


@pytest.fixture(autouse=True)
def network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A network that is down: name lookups and connections fail, as on a machine without
    one, and each attempt the test's own thread makes is recorded (a background thread left by
    an earlier test, such as the hub's telemetry, fails too but is not this test's attempt). A
    test that expects attempts empties the list."""
    attempts: list[str] = []
    test_thread = threading.get_ident()

    def note(attempt: str) -> None:
        if threading.get_ident() == test_thread:
            attempts.append(attempt)

    def getaddrinfo(host: object, *args: object, **kwargs: object) -> None:
        note(f"getaddrinfo {host}")
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known (the tests' network is down)")

    def connect(self: socket.socket, address: object) -> None:
        note(f"connect {address}")
        raise ConnectionRefusedError("the tests' network is down")

    # huggingface_hub fetches an "agent registry" for its user-agent header once per process, on
    # its first request, even with local_files_only=True: the library's own side trip, whichever
    # test comes first in a worker. Give it the empty registry it falls back to offline.
    monkeypatch.setattr(
        "huggingface_hub.utils._detect_agent._registry", {"standardEnvVars": [], "harnesses": {}}, raising=False
    )
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect)
    yield attempts
    assert attempts == [], f"the test tried to reach the network: {attempts}"


class FabricatedHub:
    """One HF_HOME for the whole file; each repository is written the first time a test needs it."""

    def __init__(self, hf_home: Path, work: Path) -> None:
        self.hf_home, self.work = hf_home, work
        self.saved: dict[str, torch.nn.Module] = {}  # the reference model written for each name

    def add(self, name: str) -> Path:
        if name not in self.saved:
            if name == HF_MODEL:
                repo_id = pretrained.pretrained_source(name)[1]
                self.saved[name] = add_cvt_repo(self.hf_home / "hub", repo_id, self.work)
            else:
                self.saved[name] = add_timm_repo(self.hf_home / "hub", name, self.work)
        return self.hf_home


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> FabricatedHub:
    return FabricatedHub(tmp_path_factory.mktemp("hf_home"), tmp_path_factory.mktemp("saved"))


# ---------------------------------------------------------------- the mapping


def test_every_family_with_released_weights_has_a_source() -> None:
    sources = {
        name: pretrained.pretrained_source(name) for name in vitlab.list_models() if pretrained.has_pretrained(name)
    }
    families = {family_of(name) for name in sources}
    assert families == {"vit", "deit", "cait", "crossvit", "pit", "levit", "cvt"}
    for name, (source, weights_id) in sources.items():
        if source == "timm":  # timm's default tag of the model of the same name
            assert weights_id.split(".")[0] == name
            assert timm.models.get_pretrained_cfg(name).hf_hub_id == f"timm/{weights_id}"
    assert sources["cvt_13"] == ("hf", "microsoft/cvt-13")
    assert sources["cvt_21"] == ("hf", "microsoft/cvt-21")
    assert set(vitlab.list_models("cvt")) <= set(sources)


@pytest.mark.parametrize(
    ("name", "where"), [("deepvit_s", "zhoudaquan/dvit_repo"), ("t2t_vit_14", "yitu-opensource/T2T-ViT")]
)
def test_unreleased_weights_say_where_the_official_ones_are(name: str, where: str) -> None:
    assert not pretrained.has_pretrained(name)
    with pytest.raises(ValueError, match="no released weights in timm or on the Hugging Face hub") as error:
        vitlab.create_model(name, pretrained=True)
    assert where in str(error.value)


def test_pretrained_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="pretrained must be a bool"):
        vitlab.create_model("vit_tiny_patch16_224", pretrained="yes")  # pyright: ignore[reportArgumentType]


# ---------------------------------------------------------------- the [pretrained] extra


def pretrained_extra() -> list[str]:
    """The package names of pyproject.toml's ``pretrained`` extra."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    return [re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0] for spec in project["optional-dependencies"]["pretrained"]]


def colab_install_address() -> str:
    """Where the Colab setup cell (the first cell of every chapter) installs vitlab from: ``git+https://...``."""
    cell = json.loads((Path(__file__).resolve().parents[1] / "notebooks/01_patches.ipynb").read_text())["cells"][0]
    found = re.search(r'"vitlab @ (git\+[^"]+)"', "".join(cell["source"]))
    assert found, "the setup cell no longer installs vitlab from git"
    return found[1]


def test_the_extra_declares_what_pretrained_imports() -> None:
    assert sorted(pretrained_extra()) == ["huggingface_hub", "timm", "transformers"]


@pytest.mark.parametrize(
    ("package", "name"),
    [("timm", "vit_tiny_patch16_224"), ("huggingface_hub", "vit_tiny_patch16_224"), ("transformers", HF_MODEL)],
)
def test_a_missing_package_names_the_install_command(
    package: str, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_cache(monkeypatch, tmp_path)  # were the check missing, nothing would be downloaded either
    monkeypatch.setitem(sys.modules, package, None)  # `import package` now raises ModuleNotFoundError
    with pytest.raises(ModuleNotFoundError) as error:
        vitlab.create_model(name, pretrained=True)
    assert error.value.name == package
    message = str(error.value)
    assert f"need the {package} package" in message
    assert f'pip install "vitlab[pretrained] @ {colab_install_address()}"' in message  # as on Colab
    assert 'pip install -e ".[pretrained]"' in message


def test_preprocessing_and_labels_without_timm_name_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)
    for call in (
        lambda: pretrained.has_pretrained("vit_tiny_patch16_224"),
        lambda: pretrained.data_config("vit_tiny_patch16_224"),
        lambda: pretrained.load_image_tensor("vit_tiny_patch16_224", np.zeros((8, 8, 3), np.uint8)),
        lambda: pretrained.top_k(torch.zeros(1000)),
    ):
        with pytest.raises(ModuleNotFoundError, match=r"vitlab\[pretrained\]"):
            call()


# ---------------------------------------------------------------- offline, nothing cached


def assert_names_the_model_and_says_how(error: pytest.ExceptionInfo, name: str, hub_cache: Path) -> None:
    assert isinstance(error.value, OSError)
    message = str(error.value)
    for words in (repr(name), "could not download", "internet once", "cached copy", str(hub_cache), "HF_HOME"):
        assert words in message


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", HF_MODEL])
def test_offline_without_a_cached_copy_names_the_model(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF_HUB_OFFLINE=1, empty cache: the named error, and no connection attempt."""
    hub_cache = use_cache(monkeypatch, tmp_path)
    with pytest.raises(pretrained.WeightsUnavailableError, match="HF_HUB_OFFLINE is set") as error:
        vitlab.create_model(name, pretrained=True)
    assert_names_the_model_and_says_how(error, name, hub_cache)


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", HF_MODEL])
def test_unreachable_hub_without_offline_flag_asks_once_and_fails_fast(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, network: list[str]
) -> None:
    """No HF_HUB_OFFLINE, no network, empty cache: the hub's own client is asked (so proxies
    and HF_ENDPOINT apply), once, without the half-minute of retries of a download, and the
    process-wide offline switch is left alone."""
    hub_cache = use_cache(monkeypatch, tmp_path, offline=False)
    if name == HF_MODEL:
        from transformers import CvtForImageClassification  # noqa: F401 (imported outside the timing)
    start = time.monotonic()
    with pytest.raises(pretrained.WeightsUnavailableError) as error:
        vitlab.create_model(name, pretrained=True)
    assert time.monotonic() - start < 10  # huggingface_hub's download retries take 23 s here
    assert_names_the_model_and_says_how(error, name, hub_cache)
    assert "HF_HUB_OFFLINE is set" not in str(error.value)
    assert network == ["getaddrinfo huggingface.co"], network  # one request, through the hub's client
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False
    network.clear()


def test_unknown_override_fails_before_any_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_cache(monkeypatch, tmp_path)
    with pytest.raises(TypeError, match="no field"):
        vitlab.create_model("vit_tiny_patch16_224", pretrained=True, not_a_field=1)


# ---------------------------------------------------------------- the fabricated cache


def test_fabricated_cache_has_the_hub_layout(hub: FabricatedHub) -> None:
    fabricated_cache = hub.add("vit_tiny_patch16_224")
    hub.add(HF_MODEL)
    repo = fabricated_cache / "hub" / "models--timm--vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    assert (repo / "refs" / "main").read_text() == COMMIT
    weights = repo / "snapshots" / COMMIT / "model.safetensors"
    assert weights.is_symlink() and weights.resolve().parent == (repo / "blobs").resolve()
    assert weights.resolve().name == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert (repo / "snapshots" / COMMIT / "config.json").is_file()
    assert (fabricated_cache / "hub" / "models--microsoft--cvt-13" / "snapshots" / COMMIT / "config.json").is_file()


@pytest.mark.parametrize("name", [*TIMM_MODELS, HF_MODEL])
def test_a_cached_copy_loads_without_network_and_gives_the_reference_logits(
    name: str, hub: FabricatedHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF_HUB_OFFLINE unset: the cached copy is read without a connection attempt (the
    ``network`` fixture checks), and gives the logits of the reference model whose weights
    were written to the cache."""
    use_cache(monkeypatch, hub.add(name), offline=False)
    model = vitlab.create_model(name, pretrained=True).eval()
    size = vitlab.get_config(name).img_size
    assert_same_logits(model, hub.saved[name], random_images(1, size), atol=1e-4)


def test_timm_reads_the_fabricated_cache_as_vitlab_does(hub: FabricatedHub, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache is the one timm's own ``pretrained=True`` reads (HF_HUB_OFFLINE=1)."""
    name = "vit_tiny_patch16_224"
    use_cache(monkeypatch, hub.add(name))
    reference = timm.create_model(name, pretrained=True).eval()
    assert_same_logits(vitlab.create_model(name, pretrained=True).eval(), reference, random_images(1, 224))


def test_num_classes_override_keeps_the_backbone_and_gives_a_fresh_head(
    hub: FabricatedHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A distilled model has two heads (``head``, ``head_dist``): both are replaced."""
    name = "deit_tiny_distilled_patch16_224"
    use_cache(monkeypatch, hub.add(name))
    released = vitlab.convert_state_dict(name, hub.saved[name].state_dict(), "timm")
    tuned = vitlab.create_model(name, pretrained=True, num_classes=10, drop_path_rate=0.1).state_dict()
    heads = {key for key in released if released[key].shape != tuned[key].shape}
    assert heads == {"head.weight", "head.bias", "head_dist.weight", "head_dist.bias"}
    for key, value in tuned.items():
        if key in heads:
            assert value.shape[0] == 10
        else:
            assert torch.equal(value, released[key]), key


# ---------------------------------------------------------------- preprocessing and labels


def test_load_image_tensor_uses_timms_transform_for_the_models_pretrained_cfg() -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(300, 400, 3), dtype=np.uint8)
    for name in ["vit_tiny_patch16_224", "crossvit_9_240", "levit_128s"]:
        cfg = timm.data.resolve_data_config(pretrained_cfg=timm.models.get_pretrained_cfg(name).to_dict())
        expected = timm.data.create_transform(**cfg)(Image.fromarray(image)).unsqueeze(0)
        got = pretrained.load_image_tensor(name, image)
        size = vitlab.get_config(name).img_size
        assert got.shape == (1, 3, size, size)
        torch.testing.assert_close(got, expected)
    gray = pretrained.load_image_tensor("vit_tiny_patch16_224", image[..., 0])
    assert gray.shape == (1, 3, 224, 224)
    with pytest.raises(TypeError, match="uint8"):
        pretrained.load_image_tensor("vit_tiny_patch16_224", image.astype(np.float32))


def test_cvt_preprocessing_matches_the_hf_image_processor() -> None:
    transformers = pytest.importorskip("transformers")
    from PIL import Image

    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, size=(300, 400, 3), dtype=np.uint8))
    processor = transformers.ConvNextImageProcessor(
        size={"shortest_edge": 224},
        crop_pct=0.875,
        resample=3,
        image_mean=list(timm.data.IMAGENET_DEFAULT_MEAN),
        image_std=list(timm.data.IMAGENET_DEFAULT_STD),
    )
    expected = processor(image, return_tensors="pt")["pixel_values"]
    got = pretrained.load_image_tensor("cvt_13", image)
    assert got.shape == expected.shape == (1, 3, 224, 224)
    # Both resize with PIL's bicubic filter; rounding to uint8 differs by at most one level.
    assert (got - expected).abs().max() < 0.05


def test_top_k_names_imagenet_classes() -> None:
    logits = torch.full((1, 1000), -10.0)
    logits[0, 281], logits[0, 282] = 5.0, 4.0
    top = pretrained.top_k(logits, k=3)
    assert [name for name, _ in top[:2]] == ["tabby, tabby cat", "tiger cat"]
    probs = [p for _, p in top]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
    assert pretrained.top_k(logits[0], k=1)[0][0] == "tabby, tabby cat"
    with pytest.raises(ValueError, match="ImageNet-1k logits"):
        pretrained.top_k(torch.zeros(2, 1000))
