"""The EWMA proximal policy of PPO-EWMA (Hilton et al. 2021): a moving average of the trained weights.

After every optimizer step, θ_prox ← β · θ_prox + (1 - β) · θ over the trainable parameters only
(for LoRA, the adapter: a few MB), starting from θ_prox = θ. π_prox's logprobs come from the same
model with θ_prox loaded into it for one no-grad pass (`swapped`), after which the live weights are
put back bit for bit. The averages are kept in float32 whatever the live dtype. Swap only between
steps: in-place writes to a parameter invalidate a forward pass still waiting for its backward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from reprorl.trainer.data import Datum
from reprorl.trainer.local import LocalTrainer


class EWMAWeights:
    """θ_prox, the exponential moving average of a list of parameters, and a way to run with it."""

    def __init__(self, params: Sequence[torch.Tensor], decay: float) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EWMA decay must be in [0, 1), got {decay}")
        if not params:
            raise ValueError("EWMAWeights needs at least one parameter")
        self.params = list(params)
        self.decay = decay
        self.weights = [p.detach().to(torch.float32, copy=True) for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        """θ_prox ← β · θ_prox + (1 - β) · θ; call once after every optimizer step."""
        for avg, p in zip(self.weights, self.params, strict=True):
            avg.mul_(self.decay).add_(p.detach().to(torch.float32), alpha=1.0 - self.decay)

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """Load θ_prox into the live parameters for the block, then restore the originals exactly."""
        with torch.no_grad():
            originals = [p.detach().clone() for p in self.params]
            for p, avg in zip(self.params, self.weights, strict=True):
                p.copy_(avg)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, original in zip(self.params, originals, strict=True):
                    p.copy_(original)

    def proximal_logprobs(self, trainer: LocalTrainer, data: Sequence[Datum]) -> list[torch.Tensor]:
        """π_prox's logprob of every next token of each datum (as `trainer.token_logprobs`)."""
        if len(trainer.params) != len(self.params) or any(
            a is not b for a, b in zip(trainer.params, self.params, strict=True)
        ):
            raise ValueError("these EWMA weights track other parameters than the trainer's")
        with self.swapped():
            return trainer.token_logprobs(data, learned_only=True)

    def state_dict(self) -> dict[str, object]:
        """The decay and a copy of θ_prox, for a checkpoint (`torch.save`-able)."""
        return {"decay": self.decay, "weights": [w.clone() for w in self.weights]}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore θ_prox (exactly) and the decay from `state_dict()`'s output."""
        weights, decay = state["weights"], state["decay"]
        if not isinstance(decay, float | int) or not 0.0 <= decay < 1.0:
            raise ValueError(f"EWMA decay must be in [0, 1), got {decay!r}")
        if not isinstance(weights, list | tuple) or len(weights) != len(self.weights):
            raise ValueError("the EWMA state does not match these parameters")
        for avg, saved in zip(self.weights, weights, strict=True):
            if not isinstance(saved, torch.Tensor) or saved.shape != avg.shape:
                raise ValueError("the EWMA state does not match these parameters' shapes")
        self.decay = float(decay)
        with torch.no_grad():
            for avg, saved in zip(self.weights, weights, strict=True):
                avg.copy_(saved)
