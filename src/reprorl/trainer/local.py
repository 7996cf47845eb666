"""The local training backend: forward_backward, optim_step and state, on torch and peft in this process.

The primitives are those of Tinker-style training APIs: `forward_backward(data, loss)` accumulates
gradients of a loss over a batch (split into micro-batches that together weigh every token the
same), `optim_step(adam)` applies AdamW and clears them, and the adapter (or the full weights) can
be saved as a standard peft / transformers folder.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reprorl.algos.base import Loss
from reprorl.config.spec import LoraAdapter
from reprorl.policy import LoadedModel, apply_lora_spec, save_adapter
from reprorl.trainer.data import Datum, collate


class AdamParams(BaseModel):
    """One optimizer step's settings; the learning rate may change every step (a schedule)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(gt=0.0, description="Learning rate of this step.")
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0, description="Adam first-moment decay.")
    beta2: float = Field(default=0.999, ge=0.0, lt=1.0, description="Adam second-moment decay.")
    eps: float = Field(default=1e-8, gt=0.0, description="Adam denominator epsilon.")
    weight_decay: float = Field(default=0.0, ge=0.0, description="Decoupled weight decay (AdamW).")
    grad_clip: float | None = Field(default=1.0, gt=0.0, description="Clip the global grad norm; None = off.")


class LocalTrainer:
    """Trains a model (a LoRA adapter, or every weight) in this process."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        base_hash: str,
        micro_batch: int = 4,
        temperature: float = 1.0,
        autocast_bf16: bool = False,
    ) -> None:
        self.model, self.tokenizer, self.base_hash = model, tokenizer, base_hash
        self.micro_batch, self.temperature = micro_batch, temperature
        # bf16 matmuls (AMX / AVX-512 BF16 where the CPU has them) with float32 master weights.
        self.autocast_bf16 = autocast_bf16
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        pad = tokenizer.pad_token_id
        self.pad_id = pad if isinstance(pad, int) else 0
        self.optimizer: torch.optim.AdamW | None = None
        self.step = 0

    @classmethod
    def lora(cls, loaded: LoadedModel, adapter: LoraAdapter, *, seed: int, **kwargs: object) -> LocalTrainer:
        model = apply_lora_spec(loaded.model, adapter, seed=seed)
        return cls(model, loaded.tokenizer, base_hash=loaded.base_hash, **kwargs)  # type: ignore[arg-type]

    def token_logprobs(self, data: Sequence[Datum]) -> list[torch.Tensor]:
        """Each datum's logprob of every next token under the current weights, without gradients."""
        out = []
        with torch.no_grad():
            for start in range(0, len(data), self.micro_batch):
                chunk = data[start : start + self.micro_batch]
                logprobs, _ = self._logprobs(chunk)
                for i, d in enumerate(chunk):
                    out.append(logprobs[i, : len(d.input_ids) - 1])
        return out

    def _logprobs(self, chunk: Sequence[Datum]) -> tuple[torch.Tensor, object]:
        collated = collate(chunk, self.pad_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast_bf16):
            logits = self.model(input_ids=collated.input_ids, attention_mask=collated.attention_mask).logits
        logp = torch.log_softmax(logits[:, :-1].float() / self.temperature, dim=-1)
        return logp.gather(-1, collated.targets[..., None])[..., 0], collated.batch

    def forward_backward(self, data: Sequence[Datum], loss: Loss) -> dict[str, float]:
        """Accumulate the gradient of `loss` over `data`; every learned token weighs the same."""
        if not data:
            raise ValueError("forward_backward needs at least one datum")
        self.model.train()
        total = sum(sum(d.mask[1:]) for d in data)
        if total <= 0:
            raise ValueError("the batch has no tokens to learn from (every mask is 0)")
        metrics: dict[str, float] = {}
        for start in range(0, len(data), self.micro_batch):
            chunk = data[start : start + self.micro_batch]
            logprobs, batch = self._logprobs(chunk)
            share = sum(sum(d.mask[1:]) for d in chunk) / total
            if share == 0:
                continue
            out = loss(logprobs, batch)  # type: ignore[arg-type]
            (out.loss * share).backward()  # type: ignore[no-untyped-call]
            for key, value in out.metrics.items():
                metrics[key] = metrics.get(key, 0.0) + value * (1.0 if key == "tokens" else share)
        metrics["loss"] = metrics.get("nll", metrics.get("loss", 0.0))
        return metrics

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        """Apply one AdamW step with these settings and clear the gradients."""
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(
                self.params,
                lr=adam.lr,
                betas=(adam.beta1, adam.beta2),
                eps=adam.eps,
                weight_decay=adam.weight_decay,
            )
        for group in self.optimizer.param_groups:
            group.update(
                lr=adam.lr, betas=(adam.beta1, adam.beta2), eps=adam.eps, weight_decay=adam.weight_decay
            )
        norm = torch.nn.utils.clip_grad_norm_(self.params, adam.grad_clip if adam.grad_clip else math.inf)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.model.train(False)
        return {"grad_norm": float(norm), "lr": adam.lr}

    def save_adapter(self, directory: Path) -> str:
        """Save the LoRA adapter (peft layout, safetensors); return its hash."""
        return save_adapter(self.model, directory, base_hash=self.base_hash)  # type: ignore[arg-type]
