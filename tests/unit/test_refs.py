"""Artifact references and names: exactly what they say, nothing after the end of the line."""

from __future__ import annotations

import pytest

from reprorl.refs import RefError, check_name, parse_ref


def test_an_artifact_reference_names_exactly_what_it_says() -> None:
    assert parse_ref("calc-train@v2").name == "calc-train"
    assert parse_ref("team/calc@sha256:" + "a" * 64).is_pinned
    for text in ("calc-train\n@v2", "calc\ntrain@v1", "calc-train @v1", "-calc@v1"):
        with pytest.raises(RefError):
            parse_ref(text)


def test_a_name_is_refused_when_it_would_read_as_a_path() -> None:
    assert check_name("calc/train-v2.1") == "calc/train-v2.1"
    for bad in ("calc\n", "../x", "a/../b", "", "-x", "x" * 129):
        with pytest.raises(RefError):
            check_name(bad)
