"""What every spec section shares: frozen, strict about keys, and owned by someone."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# At least one letter, digit, punctuation mark or symbol: a space or a zero-width character alone
# names nobody.
Owner = Annotated[
    str,
    Field(
        min_length=1,
        max_length=256,
        pattern=r"[\p{L}\p{N}\p{P}\p{S}]",
        description="Who answers for this decision (a person or team), e.g. 'alice@example.com'.",
    ),
]


class SpecModel(BaseModel):
    """Base of every spec section: frozen, strict about keys."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)
