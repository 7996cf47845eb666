"""Every reprorl error is a ReprorlError and also the builtin a caller would naturally catch."""

from __future__ import annotations

import pytest

from reprorl import errors


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (errors.UserInputError, ValueError),
        (errors.SpecError, ValueError),
        (errors.FloatingReferenceError, ValueError),
        (errors.AmbiguousReferenceError, ValueError),
        (errors.NotFoundError, KeyError),
        (errors.ArtifactNotFoundError, KeyError),
        (errors.RunNotFoundError, KeyError),
        (errors.StoreError, OSError),
        (errors.RegistryError, OSError),
        (errors.RecordError, OSError),
    ],
)
def test_hierarchy(cls: type[Exception], builtin: type[Exception]) -> None:
    assert issubclass(cls, errors.ReprorlError)
    assert issubclass(cls, builtin)


def test_integrity_error_is_a_store_error_that_names_the_artifact() -> None:
    exc = errors.IntegrityError("calc@v1: corrupt", artifact="calc@v1", expected="a", actual="b")
    assert isinstance(exc, errors.StoreError)
    assert (exc.artifact, exc.expected, exc.actual) == ("calc@v1", "a", "b")


def test_field_prefixes_message_and_not_found_reads_plainly() -> None:
    assert str(errors.SpecError("must be > 0", field="learning.lr")) == "learning.lr: must be > 0"
    assert errors.SpecError("x", field="seed").field == "seed"
    assert str(errors.ArtifactNotFoundError("no calc@v9")) == "no calc@v9"  # no KeyError quotes
