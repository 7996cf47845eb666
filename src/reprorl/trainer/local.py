"""The local training backend: forward_backward, optim_step and state, on torch and peft in this process.

The primitives are those of Tinker-style training APIs: `forward_backward(data, loss)` accumulates
gradients of a loss over a batch (split into micro-batches that together weigh every token the
same), `optim_step(adam)` applies AdamW and clears them, and the adapter (or the full weights) can
be saved as a standard peft / transformers folder.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import torch
from peft import PeftModel
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reprorl.algos.base import Loss, TokenBatch
from reprorl.config.spec import LoraAdapter
from reprorl.policy import LoadedModel, apply_lora_spec, save_adapter, save_model, tensors_hash, tree_hash
from reprorl.trainer.batching import (
    MIN_SHARED_PREFIX,
    by_length,
    micro_batches,
    sequence_weight,
    shared_prefix,
    token_weight,
)
from reprorl.trainer.data import Datum, collate, inert
from reprorl.trainer.device import pick_device

# What a loss reports of its own value: zero on a row it is inert on, so summed over the rows run
# with each one's share of the whole batch they are the whole batch's.
LOSS_VALUES = frozenset({"loss", "pg_loss", "nll"})


class AdamParams(BaseModel):
    """One optimizer step's settings; the learning rate may change every step (a schedule)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(gt=0.0, description="Learning rate of this step.")
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0, description="Adam first-moment decay.")
    beta2: float = Field(default=0.999, ge=0.0, lt=1.0, description="Adam second-moment decay.")
    eps: float = Field(default=1e-8, gt=0.0, description="Adam denominator epsilon.")
    weight_decay: float = Field(default=0.0, ge=0.0, description="Decoupled weight decay (AdamW).")
    grad_clip: float | None = Field(default=1.0, gt=0.0, description="Clip the global grad norm; None = off.")


STATE_WEIGHTS = "trainer.safetensors"
STATE_OPTIMIZER = "optimizer.pt"


def _adamw(params: list[torch.nn.Parameter], adam: AdamParams) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        params, lr=adam.lr, betas=(adam.beta1, adam.beta2), eps=adam.eps, weight_decay=adam.weight_decay
    )


class LocalTrainer:
    """Trains a model (a LoRA adapter, or every weight) in this process."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        base_hash: str,
        micro_batch: int = 8,
        max_positions: int = 4096,
        temperature: float = 1.0,
        autocast_bf16: bool = False,
        device: torch.device | None = None,
    ) -> None:
        self.device = device or pick_device()
        cast(torch.nn.Module, model).to(self.device)  # in place; transformers' `to` hides torch's type
        self.model, self.tokenizer, self.base_hash = model, tokenizer, base_hash
        self.micro_batch, self.temperature = micro_batch, temperature
        # A micro-batch's padded positions at most (see `micro_batches`); it also bounds its memory.
        self.max_positions = max_positions
        # bf16 matmuls (tensor cores; AMX / AVX-512 BF16 where the CPU has them) with float32
        # master weights.
        self.autocast_bf16 = autocast_bf16
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        pad = tokenizer.pad_token_id
        self.pad_id = pad if isinstance(pad, int) else 0
        self.optimizer: torch.optim.AdamW | None = None
        self.reference: PreTrainedModel | None = None
        # The reference's trained tensors where it is not the base: the weights `pin_reference` froze.
        self.pinned: dict[str, torch.Tensor] | None = None
        # Weights a token's forward pass multiplies by: every linear layer's, the head's included
        # (a tied head counts once, as it is one matrix), LoRA's factors too; not the embedding lookup.
        self.matmul_params = sum(
            m.weight.numel() for m in cast(torch.nn.Module, model).modules() if isinstance(m, torch.nn.Linear)
        )
        self.init_adapter: str | None = None  # hash of the adapter training continued from, if any
        self.step = 0

    @classmethod
    def lora(cls, loaded: LoadedModel, adapter: LoraAdapter, *, seed: int, **kwargs: object) -> LocalTrainer:
        model = apply_lora_spec(loaded.model, adapter, seed=seed)
        return cls(model, loaded.tokenizer, base_hash=loaded.base_hash, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def full(cls, loaded: LoadedModel, **kwargs: object) -> LocalTrainer:
        """Train every weight of `loaded.model`; a frozen copy is kept as the KL reference."""
        reference = copy.deepcopy(loaded.model).requires_grad_(False)
        loaded.model.requires_grad_(True)
        trainer = cls(loaded.model, loaded.tokenizer, base_hash=loaded.base_hash, **kwargs)  # type: ignore[arg-type]
        cast(torch.nn.Module, reference).to(trainer.device)
        trainer.reference = reference
        return trainer

    @property
    def trains_adapter(self) -> bool:
        """True for a LoRA adapter on frozen base weights, False when every weight is trained."""
        return isinstance(self.model, PeftModel)

    @property
    def reference_available(self) -> bool:
        """Whether reference logprobs can be computed (the base under the adapter, or a frozen copy)."""
        return isinstance(self.model, PeftModel) or self.reference is not None

    @property
    def reference_version(self) -> str | None:
        """Hash of the pinned reference's trained tensors; None where the reference is the base."""
        return tensors_hash(self.pinned) if self.pinned is not None else None

    def pin_reference(self, tensors: dict[str, torch.Tensor] | None = None) -> str:
        """Make `tensors` (by default the weights trained so far) the KL reference from now on, in
        place of the base: a warm-started policy held near its start. Returns their hash."""
        tensors = tensors if tensors is not None else self.trainable_state()
        expected = {n for n, p in self.model.named_parameters() if p.requires_grad}
        if set(tensors) != expected:
            raise ValueError("the reference's tensors do not fit this trainer's trained parameters")
        if self.reference is not None:  # every weight trained: the frozen copy takes them, once
            params = dict(self.reference.named_parameters())
            with torch.no_grad():
                for name, t in tensors.items():
                    params[name].copy_(t)
            self.pinned = {n: params[n].detach() for n in tensors}
        else:
            self.pinned = {n: t.detach().clone() for n, t in tensors.items()}
        return tensors_hash(self.pinned)

    def reference_logprobs(self, data: Sequence[Datum]) -> list[torch.Tensor]:
        """Logprobs under the reference policy: the base model without the adapter (or its frozen
        copy), or the weights `pin_reference` froze."""
        if isinstance(self.model, PeftModel):
            if self.pinned is not None:
                return self._under(self.pinned, data)
            with self.model.disable_adapter():
                return self.token_logprobs(data, learned_only=True)
        if self.reference is None:
            raise ValueError("this trainer keeps no reference model")
        trained, self.model = self.model, self.reference
        try:
            return self.token_logprobs(data, learned_only=True)
        finally:
            self.model = trained

    def _under(self, tensors: dict[str, torch.Tensor], data: Sequence[Datum]) -> list[torch.Tensor]:
        """Learned-token logprobs with the adapter's weights swapped for `tensors` (a few MB) and back
        bit for bit."""
        params = dict(self.model.named_parameters())
        kept = {n: params[n].detach().clone() for n in tensors}
        with torch.no_grad():
            for name, t in tensors.items():
                params[name].copy_(t)
        try:
            return self.token_logprobs(data, learned_only=True)
        finally:
            with torch.no_grad():
                for name, t in kept.items():
                    params[name].copy_(t)

    def snapshot(self) -> tuple[str, dict[str, torch.Tensor]]:
        """The trained tensors as the rollout side receives them, with their version (hash)."""
        tensors = {n: t.clone() for n, t in self.trainable_state().items()}
        return tensors_hash(tensors), tensors

    def token_logprobs(self, data: Sequence[Datum], *, learned_only: bool = False) -> list[torch.Tensor]:
        """Each datum's logprob of every next token under the current weights, without gradients.

        With `learned_only`, only the learned tokens' (mask 1) are computed, the rest are 0: all a
        loss reads, for a fraction of the memory.
        """
        order = by_length(data)
        out: list[torch.Tensor | None] = [None] * len(data)
        with torch.no_grad():
            for cut in self._cuts([data[i] for i in order]):
                rows = [order[j] for j in cut]
                chunk = [data[i] for i in rows]
                logprobs, _, _ = self._logprobs(chunk, learned_only=learned_only)
                for i, row in enumerate(rows):
                    out[row] = logprobs[i, : len(data[row].input_ids) - 1].cpu()
        return [t for t in out if t is not None]

    def _logprobs(
        self, chunk: Sequence[Datum], *, entropy: bool = False, learned_only: bool = True
    ) -> tuple[torch.Tensor, TokenBatch, float]:
        """Logprobs of the next tokens, the loss's side data, and the summed entropy on learned tokens.

        With `learned_only`, the vocabulary projection runs only where a token is learned (mask 1):
        prompts and tool results need no logits, and [tokens x vocabulary] is most of the memory.
        Elsewhere the returned logprobs are 0.
        """
        collated = collate(chunk, self.pad_id).to(self.device)
        model = self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model
        keep = collated.batch.mask > 0 if learned_only else collated.attention_mask[:, 1:] > 0
        # The rows' common prefix (system prompt, tool schemas, a group's task) is run once and its
        # keys and values are shared; gradients from every row flow back into it. Only a prefix
        # that predicts no kept token can be shared: its logits are not computed.
        ids, shared = collated.input_ids, 0
        if len(chunk) > 1:
            first_kept = int(keep.any(dim=0).long().argmax()) if bool(keep.any()) else keep.shape[1]
            shared = min(shared_prefix(ids), first_kept)
            shared = shared if shared >= MIN_SHARED_PREFIX else 0
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast_bf16):
            cache = None
            if shared:
                cache = model.model(input_ids=ids[:1, :shared], use_cache=True).cache
                cache.batch_repeat_interleave(len(chunk))
            width = ids.shape[1]
            # Rows are right-padded: under the causal mask a real token sees only real tokens, so
            # without a shared prefix no padding mask is passed, and attention runs its causal
            # kernel, which skips the blocks above the diagonal (half the work).
            hidden = model.model(
                input_ids=ids[:, shared:],
                attention_mask=collated.attention_mask if shared else None,
                position_ids=torch.arange(shared, width, device=self.device)[None].expand(len(chunk), -1),
                cache=cache,
                use_cache=cache is not None,
            ).last_hidden_state
            logits = model.lm_head(hidden[:, :-1][keep[:, shared:]])
        rows = torch.log_softmax(logits.float() / self.temperature, dim=-1)
        total = 0.0
        if entropy:
            with torch.no_grad():
                total = float(-(rows.exp() * rows).sum())
        picked = rows.gather(-1, collated.targets[keep][:, None])[:, 0]
        logprobs = torch.zeros(keep.shape, dtype=picked.dtype, device=picked.device).masked_scatter(
            keep, picked
        )
        return logprobs, collated.batch, total

    def _cuts(self, rows: Sequence[Datum]) -> list[list[int]]:
        return micro_batches([len(d.input_ids) for d in rows], self.micro_batch, self.max_positions)

    def rows_to_run(self, data: Sequence[Datum], loss: Loss) -> list[int]:
        """The rows `forward_backward` runs: those the loss is not inert on. Where it is inert on every
        one, the first micro-batch of rows with learned tokens still runs: its gradient is zero, so the
        optimizer's step is what it would have been (its moments move on), and the health figures
        (entropy, KL to the reference, sampler mismatch) stay measured every step."""
        run = [i for i, d in enumerate(data) if not inert(d, loss)]
        return run or [i for i, d in enumerate(data) if any(d.mask[1:])][: self.micro_batch]

    def forward_backward(self, data: Sequence[Datum], loss: Loss) -> dict[str, float]:
        """Accumulate the gradient of `loss` over `data`, averaged as the loss says (`loss.mean`):
        split into micro-batches, each one's loss is weighted by its share of the batch's learned
        tokens, or of its sequences that have one, so the sum is the loss of the whole batch.

        Rows the loss is inert on (advantage 0 under a loss without a KL term) are not run
        (`rows_to_run`): they add nothing to the loss or the gradient, and they still count in its
        mean. The loss's own values (`loss`, `pg_loss`, `nll`) are then the whole batch's, exactly;
        its other figures (clip fractions, importance weights, KL to the reference) and `entropy`
        are over the rows run.
        """
        if not data:
            raise ValueError("forward_backward needs at least one datum")
        self.model.train()
        total = sum(sum(d.mask[1:]) for d in data)
        if total <= 0:
            raise ValueError("the batch has no tokens to learn from (every mask is 0)")
        run = [data[i] for i in self.rows_to_run(data, loss)]
        run = [run[i] for i in by_length(run)]
        weight = token_weight if loss.mean == "token" else sequence_weight
        whole, ran = weight(data), weight(run)
        metrics: dict[str, float] = {}
        entropy_sum, positions = 0.0, 0
        for cut in self._cuts(run):
            chunk = [run[j] for j in cut]
            share = weight(chunk) / whole
            if share == 0:
                continue
            positions += sum(len(d.input_ids) for d in chunk)
            logprobs, batch, entropy = self._logprobs(chunk, entropy=True)
            entropy_sum += entropy
            out = loss(logprobs, batch)
            (out.loss * share).backward()  # type: ignore[no-untyped-call]
            for key, value in out.metrics.items():
                scale = 1.0 if key == "tokens" else share if key in LOSS_VALUES else weight(chunk) / ran
                metrics[key] = metrics.get(key, 0.0) + value * scale
        metrics["loss"] = metrics.get("nll", metrics.get("loss", 0.0))
        learned = token_weight(run)
        if learned > 0:
            metrics["entropy"] = entropy_sum / learned
        metrics["skipped_rows"] = float(len(data) - len(run))
        # The update's FLOP bound: a forward pass costs 2 FLOPs per weight and token, the backward
        # pass 2 more for the activations' gradients and, where every weight learns, 2 more for theirs.
        per_token = (4 if self.trains_adapter else 6) * self.matmul_params
        metrics["positions"] = float(positions)
        metrics["model_flops"] = float(per_token * positions)
        return metrics

    def reset_optimizer(self) -> None:
        """Forget the optimizer's moments; the next `optim_step` starts a new AdamW."""
        self.optimizer = None

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        """Apply one AdamW step with these settings and clear the gradients."""
        if self.optimizer is None:
            self.optimizer = _adamw(self.params, adam)
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

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The trained tensors by parameter name (the adapter's, or every weight), on the CPU (the
        parameters themselves there; copies of them from a GPU)."""
        return {n: p.detach().cpu() for n, p in self.model.named_parameters() if p.requires_grad}

    def save_state(self, directory: Path) -> None:
        """Write everything the next step depends on: trained weights, optimizer moments, RNG, step.

        Loading it into a trainer built the same way continues bit for bit where this one stops.
        """
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {f"param/{n}": t.contiguous() for n, t in self.trainable_state().items()}
        tensors |= {f"reference/{n}": t.contiguous() for n, t in (self.pinned or {}).items()}
        tensors["rng/torch"] = torch.get_rng_state()
        save_file(tensors, str(directory / STATE_WEIGHTS), metadata={"step": str(self.step)})
        optimizer = self.optimizer.state_dict() if self.optimizer is not None else None
        torch.save({"optimizer": optimizer, "step": self.step}, directory / STATE_OPTIMIZER)

    def load_state(self, directory: Path) -> None:
        """Restore what `save_state` wrote; the parameter names must match this trainer's."""
        tensors = load_file(str(directory / STATE_WEIGHTS))
        params = dict(self.model.named_parameters())
        names = {k.removeprefix("param/") for k in tensors if k.startswith("param/")}
        expected = {n for n, p in params.items() if p.requires_grad}
        if names != expected:
            missing, extra = sorted(expected - names)[:3], sorted(names - expected)[:3]
            raise ValueError(f"trainer state does not fit this model: missing {missing}, unexpected {extra}")
        with torch.no_grad():
            for name in names:
                params[name].copy_(tensors[f"param/{name}"])
        saved = torch.load(directory / STATE_OPTIMIZER, weights_only=True)
        self.optimizer = None
        if saved["optimizer"] is not None:
            self.optimizer = _adamw(self.params, AdamParams(lr=1.0))
            self.optimizer.load_state_dict(saved["optimizer"])
        self.step = int(saved["step"])
        pinned = {k.removeprefix("reference/"): t for k, t in tensors.items() if k.startswith("reference/")}
        if pinned:
            self.pin_reference(pinned)
        elif self.pinned is not None:  # the checkpoint's reference is the base
            if self.reference is not None:
                raise ValueError("this trainer's frozen copy holds pinned weights, not the base's")
            self.pinned = None
        torch.set_rng_state(tensors["rng/torch"])
        self.model.train(False)

    def save_adapter(self, directory: Path) -> str:
        """Save what was trained: the LoRA adapter (peft layout) or the full model; return its hash.

        Both are standard folders with safetensors weights: `PeftModel.from_pretrained` and vLLM
        read the adapter, `from_pretrained` (and `reprorl` as a base) the full model.
        """
        if isinstance(self.model, PeftModel):
            return save_adapter(self.model, directory, base_hash=self.base_hash)
        save_model(self.model, self.tokenizer, directory)
        return tree_hash(directory)
