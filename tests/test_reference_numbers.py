"""book/reference_numbers.md against vitlab: every count, token grid and hyperparameter on the
page is recomputed from the models (on the meta device: shapes only, no memory)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

import vitlab
from vitlab.family import FAMILY_PROPERTIES, build_on_meta, family_of, model_table
from vitlab.utils import count_parameters

PAGE = Path(__file__).resolve().parents[1] / "book" / "reference_numbers.md"
NAME = re.compile(r"^`([a-z0-9_]+)`$")


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every Markdown table of ``text`` as (header cells, rows of cells)."""
    found, block = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif block:
            found.append((block[0], block[2:]))
            block = []
    return found


@cache
def rows_by_column(column: str) -> dict[str, dict[str, str]]:
    """model name -> {header: cell} for the rows of the tables that have ``column``."""
    rows: dict[str, dict[str, str]] = {}
    for header, body in tables(PAGE.read_text(encoding="utf-8")):
        if column not in header:
            continue
        for cells in body:
            match = NAME.match(cells[0])
            if match:
                rows[match.group(1)] = dict(zip(header, cells, strict=True))
    return rows


def number(cell: str) -> int:
    return int(cell.replace(",", "").replace("*", "").strip())


def test_every_preset_has_a_row() -> None:
    for column in ("Parameters", "Config"):
        assert set(rows_by_column(column)) == set(vitlab.list_models()), column


def test_every_row_names_a_source() -> None:
    for column in ("Parameters", "Config"):
        for name, row in rows_by_column(column).items():
            assert row.get("Source", "").strip(" —-"), f"{name}: no source"


def first_of_each_family_fast(names: list[str]) -> list:
    """Every preset; all but each family's first are slow (``make test`` runs them all)."""
    seen: set[str] = set()
    params = []
    for name in names:
        params.append(pytest.param(name, marks=pytest.mark.slow) if family_of(name) in seen else name)
        seen.add(family_of(name))
    return params


@pytest.mark.parametrize("name", first_of_each_family_fast(vitlab.list_models()))
def test_parameters_macs_and_tokens(name: str) -> None:
    """One meta-device forward pass per model (``vitlab.family.model_table``)."""
    row = rows_by_column("Parameters")[name]
    measured = model_table([name])[0]
    assert number(row["Parameters"]) == measured["params"], name
    if row["Trainable"].strip(" —"):
        assert number(row["Trainable"]) == count_parameters(build_on_meta(name), trainable_only=True), name
    assert row["GMACs"] == f"{measured['macs'] / 1e9:.2f}", name
    separator = " ∥ " if FAMILY_PROPERTIES[family_of(name)].branches > 1 else " → "
    assert row["Tokens per stage"] == separator.join(str(n) for n in measured["tokens"]), name


def test_hyperparameters_equal_the_configs() -> None:
    """The "Config" cells list ``field=value`` pairs; each equals the preset's config field."""
    for name, row in rows_by_column("Config").items():
        config = vitlab.get_config(name)
        pairs = re.findall(r"`([a-z_]+)=([^`]+)`", row["Config"])
        assert pairs, f"{name}: no field=value pairs"
        for field, value in pairs:
            assert getattr(config, field) == ast.literal_eval(value), f"{name}.{field}"
