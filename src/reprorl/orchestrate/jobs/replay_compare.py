"""A replay's findings: the first place where a re-executed rollout and its record disagree, and
how many of the recorded tokens it drew again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from reprorl.policy.sampling import Sample
from reprorl.types import ToolResult, Trajectory, Turn, parse_sample_key

Mode = Literal["recorded", "live"]


@dataclass(frozen=True)
class Difference:
    """The first place where the replay and the record disagree."""

    where: str  # "token", "logprob", "context", "tool_result", "turns", "reward", "termination", "condition"
    turn: int | None
    index: int | None
    recorded: Any
    replayed: Any


@dataclass
class ReplayReport:
    rollout_id: str
    mode: Mode
    turns: int = 0
    tokens: int = 0
    # Token agreement: of the recorded tokens of turns re-sampled from their recorded context, how
    # many the replay drew again before its first differing token (a rate, where a bare "differs"
    # says little: an engine that does not batch-reproduce agrees on most tokens, or it does not).
    compared: int = 0
    agreed: int = 0
    differences: list[Difference] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differences

    @property
    def first(self) -> Difference | None:
        return self.differences[0] if self.differences else None

    @property
    def agreement(self) -> float | None:
        return self.agreed / self.compared if self.compared else None

    def to_json(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id,
            "mode": self.mode,
            "identical": self.identical,
            "turns": self.turns,
            "tokens": self.tokens,
            "tokens_compared": self.compared,
            "tokens_agreed": self.agreed,
            "agreement": self.agreement,
            "first_difference": asdict(self.first) if self.first else None,
        }


def compare_sample(report: ReplayReport, turn: int, recorded: Trajectory, sample: Sample) -> None:
    expected = recorded.turns[turn].row(parse_sample_key(sample.key)[2])
    if expected is None:
        report.differences.append(Difference("turns", turn, None, None, sample.key))
        return
    report.turns += 1
    report.tokens += len(sample.token_ids)
    if isinstance(expected, Turn) and expected.reused != sample.reused:
        # The row took another share of its previous turn's kept cache: other bits follow.
        report.differences.append(
            Difference("condition", turn, None, f"reused {expected.reused}", f"reused {sample.reused}")
        )
    if expected.stop is not None:  # the agent's stop string cut it: what came after was never kept
        sample = replace(
            sample,
            token_ids=sample.token_ids[: len(expected.token_ids)],
            logprobs=sample.logprobs[: len(expected.token_ids)],
        )
    report.compared += len(expected.token_ids)
    for i, (a, b) in enumerate(zip(expected.token_ids, sample.token_ids, strict=False)):
        if a != b:
            report.agreed += i
            report.differences.append(Difference("token", turn, i, a, b))
            return
    report.agreed += min(len(expected.token_ids), len(sample.token_ids))
    if len(expected.token_ids) != len(sample.token_ids):
        n = min(len(expected.token_ids), len(sample.token_ids))
        report.differences.append(
            Difference("token", turn, n, len(expected.token_ids), len(sample.token_ids))
        )
        return
    for i, (x, y) in enumerate(zip(expected.logprobs, sample.logprobs, strict=False)):
        if x != y:  # bit equality: both are the same float32 value widened to a double
            report.differences.append(Difference("logprob", turn, i, x, y))
            return


def results_key(results: Sequence[ToolResult]) -> list[tuple[Any, ...]]:
    return [(r.name, r.outcome.value, r.content, r.error, r.noise, r.original_chars) for r in results]


def compare_live(report: ReplayReport, recorded: Trajectory, live: Trajectory) -> None:
    for a, b in zip(recorded.turns, live.turns, strict=False):
        if a.prompt_token_ids != b.prompt_token_ids:
            report.differences.append(
                Difference("context", a.index, None, len(a.prompt_token_ids), len(b.prompt_token_ids))
            )
        if results_key(a.tool_results) != results_key(b.tool_results):
            report.differences.append(
                Difference(
                    "tool_result", a.index, None, results_key(a.tool_results), results_key(b.tool_results)
                )
            )
    if len(recorded.turns) != len(live.turns):
        report.differences.append(Difference("turns", None, None, len(recorded.turns), len(live.turns)))
    ra, rb = recorded.reward, live.reward
    if ra is not None and rb is not None:
        # A component the record does not hold was added to the platform since (and weighs
        # nothing in the recorded total, or the total would differ): it is not a difference.
        rb = rb.model_copy(
            update={"components": {k: v for k, v in rb.components.items() if k in ra.components}}
        )
    if (ra and ra.model_dump()) != (rb and rb.model_dump()):
        report.differences.append(
            Difference("reward", None, None, ra and ra.model_dump(), rb and rb.model_dump())
        )
    if recorded.termination != live.termination:
        report.differences.append(
            Difference("termination", None, None, recorded.termination.value, live.termination.value)
        )
