"""The chat templates TRL ships (``trl/chat_templates/*.jinja`` of its wheel, fetched with pip into
``.cache/trl-wheel/``): agentrl doctor's verdict on each, on a test tokenizer carrying the template's special
tokens, equals the row checked by hand in ``tests/data/template_conformance.json``. A change in what the doctor
finds for any family (appends only, tools shown, the parser that reads the calls back, stop tokens, what agentrl
would use) fails here, naming the template and the field; regenerate the file with
``python -m tests.template_conformance --write`` once the change is understood."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.template_conformance import (
    TRL_VERSION,
    TemplatesUnavailable,
    compute_rows,
    expected_rows,
    fetch_templates,
    render_markdown,
)

pytestmark = [pytest.mark.integration]

EXPECTED = expected_rows()


@pytest.fixture(scope="module")
def templates() -> dict[str, str]:
    try:
        return fetch_templates()
    except TemplatesUnavailable as e:
        require(False, f"the chat templates of trl=={TRL_VERSION}: {e}")
        raise  # not reached: require skips or fails


@pytest.fixture(scope="module")
def rows(templates: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    require(importlib.util.find_spec("vllm") is not None, "vLLM (its tool parsers) is not installed")
    work: Path = tmp_path_factory.mktemp("template-conformance")
    return {r["template"]: r for r in compute_rows(templates, work)}


def test_the_templates_are_the_expected_ones(templates: dict[str, str]) -> None:
    new, gone = sorted(set(templates) - set(EXPECTED)), sorted(set(EXPECTED) - set(templates))
    assert not new and not gone, (f"trl=={TRL_VERSION} ships templates the expected rows lack: {new}; the expected "
                                  f"rows name templates it does not ship: {gone}")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_doctor_finds_what_was_checked(name: str, rows: dict[str, dict[str, Any]]) -> None:
    assert name in rows, f"{name}: no row computed (the wheel does not ship it)"
    got, want = rows[name], EXPECTED[name]
    changed = [f"  {field}: expected {want.get(field)!r}, got {got.get(field)!r}"
               for field in sorted(set(want) | set(got)) if want.get(field) != got.get(field)]
    assert not changed, f"template {name}: the doctor's row changed\n" + "\n".join(changed)


def test_the_table_has_a_line_per_template(rows: dict[str, dict[str, Any]]) -> None:
    table = render_markdown(rows[n] for n in sorted(rows)).splitlines()
    assert len(table) == len(rows) + 2 and all(line.count(" | ") == 6 for line in table[2:]), table[:3]
