"""Training data: a trajectory's tokens as one sequence, with the mask of what the policy produced.

A multi-turn trajectory is trained on exactly the tokens it was sampled from (token-in/token-out):
the context of its last turn followed by that turn's sampled tokens (one such sequence per context
where an agent edited its history and a turn was sampled in a context rendered afresh). Sampled
tokens are learned from (mask 1, with the behaviour logprob recorded at sampling); prompts and
rendered tool results are context only (mask 0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from reprorl.algos.base import Loss, TokenBatch
from reprorl.types import Trajectory


@dataclass(frozen=True)
class Datum:
    """One training sequence: tokens, which of them to learn from, and its advantage."""

    input_ids: tuple[int, ...]
    mask: tuple[float, ...]  # per token of input_ids: 1 if the policy produced it
    behaviour_logprobs: tuple[float, ...]  # per token of input_ids; 0 where mask is 0
    advantage: float = 0.0
    policy_version: str = ""
    # Per token of input_ids (0 on the first), computed by the trainer: under the proximal policy
    # of PPO (None = the current weights before the update) and under the reference (for KL).
    proximal_logprobs: tuple[float, ...] | None = None
    reference_logprobs: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not len(self.input_ids) == len(self.mask) == len(self.behaviour_logprobs):
            raise ValueError("input_ids, mask and behaviour_logprobs must have one entry per token")
        for extra in (self.proximal_logprobs, self.reference_logprobs):
            if extra is not None and len(extra) != len(self.input_ids):
                raise ValueError("proximal and reference logprobs must have one entry per token")
        if len(self.input_ids) < 2:
            raise ValueError("a training sequence needs at least two tokens")


def inert(datum: Datum, loss: Loss) -> bool:
    """Whether `datum` adds nothing to `loss` or its gradient (advantage 0 under a loss that is a
    product with the advantage): it is not run, and it still counts in the loss's mean."""
    return datum.advantage == 0.0 and bool(getattr(loss, "inert_at_zero_advantage", False))


def from_trajectory(trajectory: Trajectory, advantage: float = 0.0) -> Datum:
    """The trajectory's full token sequence; its sampled tokens are the ones learned from.

    Only for a trajectory sampled in one context throughout; `sequences` splits one whose agent
    edited its history."""
    parts = sequences(trajectory, advantage)
    if len(parts) != 1:
        raise ValueError(
            f"rollout {trajectory.rollout_id} was sampled in {len(parts)} contexts; use sequences()"
        )
    return parts[0]


def sequences(trajectory: Trajectory, advantage: float = 0.0) -> list[Datum]:
    """One sequence per context the trajectory was sampled in, each with the trajectory's advantage.

    A turn whose context was rendered afresh (`Turn.context_reset`: the agent behind the proxy sent
    an edited history) starts a new sequence, so every trained token is learned in exactly the
    context it was sampled in."""
    starts = [i for i, turn in enumerate(trajectory.turns) if i == 0 or turn.context_reset]
    ends = [*starts[1:], len(trajectory.turns)]
    return [_sequence(trajectory, a, b, advantage) for a, b in zip(starts, ends, strict=True)]


def _sequence(trajectory: Trajectory, start: int, end: int, advantage: float) -> Datum:
    ids: list[int] = []
    mask: list[float] = []
    logprobs: list[float] = []
    for turn in trajectory.turns[start:end]:
        ids.extend(turn.prompt_token_ids)
        mask.extend(0.0 for _ in turn.prompt_token_ids)
        logprobs.extend(0.0 for _ in turn.prompt_token_ids)
        ids.extend(turn.token_ids)
        mask.extend(1.0 for _ in turn.token_ids)
        logprobs.extend(turn.logprobs if turn.logprobs else [0.0] * len(turn.token_ids))
    return Datum(tuple(ids), tuple(mask), tuple(logprobs), advantage, trajectory.policy_version)


@dataclass(frozen=True)
class Collated:
    """A padded batch: model inputs and the loss's side data, targets shifted by one."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    targets: torch.Tensor  # [B, L-1]
    batch: TokenBatch

    def to(self, device: torch.device) -> Collated:
        """The same batch on `device` (itself, on the device it is already on)."""
        if device.type == "cpu":
            return self
        b = self.batch

        def moved(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return Collated(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.targets.to(device),
            TokenBatch(
                mask=b.mask.to(device),
                behaviour_logprobs=b.behaviour_logprobs.to(device),
                advantages=b.advantages.to(device),
                reference_logprobs=moved(b.reference_logprobs),
                proximal_logprobs=moved(b.proximal_logprobs),
            ),
        )


def collate(data: Sequence[Datum], pad_id: int) -> Collated:
    """Right-pad to the longest sequence; position t predicts token t+1."""
    if not data:
        raise ValueError("an empty batch")
    width = max(len(d.input_ids) for d in data)
    ids = torch.full((len(data), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(data), width), dtype=torch.long)
    mask = torch.zeros((len(data), width), dtype=torch.float32)
    behaviour = torch.zeros((len(data), width), dtype=torch.float32)
    for i, d in enumerate(data):
        n = len(d.input_ids)
        ids[i, :n] = torch.tensor(d.input_ids)
        attention[i, :n] = 1
        mask[i, :n] = torch.tensor(d.mask)
        behaviour[i, :n] = torch.tensor(d.behaviour_logprobs)
    proximal = _optional([d.proximal_logprobs for d in data], width)
    reference = _optional([d.reference_logprobs for d in data], width)
    return Collated(
        input_ids=ids,
        attention_mask=attention,
        targets=ids[:, 1:],
        batch=TokenBatch(
            mask=mask[:, 1:],
            behaviour_logprobs=behaviour[:, 1:],
            advantages=torch.tensor([d.advantage for d in data], dtype=torch.float32),
            proximal_logprobs=proximal[:, 1:] if proximal is not None else None,
            reference_logprobs=reference[:, 1:] if reference is not None else None,
        ),
    )


def _optional(rows: Sequence[tuple[float, ...] | None], width: int) -> torch.Tensor | None:
    """A padded [B, L] tensor when every datum carries the values, else None (all or nothing)."""
    present = [r is not None for r in rows]
    if not any(present):
        return None
    if not all(present):
        raise ValueError("some data carry proximal/reference logprobs and some do not")
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r or ())] = torch.tensor(r)
    return out


def with_logprobs(
    data: Sequence[Datum],
    *,
    proximal: Sequence[torch.Tensor] | None = None,
    reference: Sequence[torch.Tensor] | None = None,
) -> list[Datum]:
    """`data` carrying the trainer-computed logprobs (as `token_logprobs` returns them, per datum)."""

    def per_token(values: torch.Tensor | None) -> tuple[float, ...] | None:
        return None if values is None else (0.0, *values.tolist())

    out = []
    for i, d in enumerate(data):
        out.append(
            dataclasses.replace(
                d,
                proximal_logprobs=per_token(proximal[i]) if proximal is not None else d.proximal_logprobs,
                reference_logprobs=per_token(reference[i]) if reference is not None else d.reference_logprobs,
            )
        )
    return out
