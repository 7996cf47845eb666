"""docs/spec.md's reference section is generated from the spec's field descriptions."""

from __future__ import annotations

from pathlib import Path

from reprorl.config import RunSpec
from reprorl.config.reference import BEGIN, END, render_reference

DOC = Path(__file__).resolve().parents[3] / "docs" / "spec.md"


def test_docs_spec_reference_is_current() -> None:
    text = DOC.read_text(encoding="utf-8")
    generated = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert generated == render_reference().strip(), "docs/spec.md is stale: run `make docs`"


def test_reference_lists_every_field_of_every_section() -> None:
    rendered = render_reference()
    for section in (
        RunSpec,
        *(f.annotation for f in RunSpec.model_fields.values() if isinstance(f.annotation, type)),
    ):
        for name in getattr(section, "model_fields", {}):
            assert f"| `{name}` |" in rendered, name
