"""The shared figure machinery (vitlab.diagrams): style, rendering and shape tracing.

Each chapter's figure has its own test file (tests/test_diagrams_<paper>.py) that checks
the numbers it writes against the model.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from vitlab.diagrams import KINDS, Diagram, numbers_in, png_size, shape_label, trace_shapes

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


def test_shape_label_drops_nothing_and_names_axes() -> None:
    assert shape_label((197, 192)) == "197 × 192"
    assert shape_label([3, 224, 224], names="C × H × W") == "3 × 224 × 224 (C × H × W)"


def test_numbers_in_reads_every_integer() -> None:
    assert numbers_in(["197 × 192", "MLP 192 → 768", "86,567,656 parameters"]) == {197, 192, 768, 86567656}


def test_every_kind_has_one_style_and_unknown_kinds_are_refused() -> None:
    fills = [fill for fill, _ in KINDS.values()]
    assert len(set(fills)) == len(fills), "two kinds of block share a colour"
    d = Diagram("t")
    with pytest.raises(ValueError, match="kind must be one of"):
        d.block("x", "x", kind="transformer")


def test_a_changed_block_is_marked_by_shape_and_words_not_only_colour() -> None:
    d = Diagram("t")
    d.block("a", "attention", kind="attention")
    d.block("b", "re-attention", kind="attention", changed=True)
    source = d.source()
    plain, changed = (line for line in source.splitlines() if line.strip().startswith(('"a"', '"b"')))
    assert "peripheries=2" in changed and "peripheries" not in plain
    assert "new: re-attention" in d.texts


def test_groups_nest_and_labels_are_escaped() -> None:
    d = Diagram('a "quoted" title')
    with d.group("block × 12"):
        d.block("n", "line one\nline two", kind="norm")
    source = d.source()
    assert "subgraph cluster_1 {" in source and '\\"quoted\\"' in source and "line one\\nline two" in source
    assert source.count("{") == source.count("}")


@needs_dot
def test_renders_a_png_that_fits_the_column() -> None:
    d = Diagram("t")
    d.block("a", "image", kind="data")
    d.block("b", "patch embedding", kind="embed")
    d.arrow("a", "b", shape_label((3, 224, 224)))
    data = d.png()
    width, height = png_size(data)
    assert width > 0 and height > 0
    shown = d.show()
    assert shown.width is not None and shown.width <= 560


def test_png_size_refuses_other_data() -> None:
    with pytest.raises(ValueError, match="not a PNG"):
        png_size(b"GIF89a" + bytes(30))


def test_trace_shapes_reports_each_named_module_once() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    shapes = trace_shapes(model, (5, 4), ["0", "2"])
    assert shapes == {"0": (5, 8), "2": (5, 2)}
    assert not model[0]._forward_hooks, "the hooks must be removed"


def test_trace_shapes_names_what_is_wrong() -> None:
    model = nn.Sequential(nn.Linear(4, 8))
    with pytest.raises(KeyError, match="not submodules"):
        trace_shapes(model, (1, 4), ["nope"])

    class Skips(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    with pytest.raises(RuntimeError, match="not called"):
        trace_shapes(Skips(), (1, 4), ["unused"])
