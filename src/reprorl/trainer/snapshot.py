"""The sampling snapshot: a plain model holding the trainer's current weights, with the adapter merged in.

The rollout side samples from a model without adapter layers, so every sampled token costs what it
costs on the base (the fused decode path applies), and the weights it reads are exactly
`W + (alpha/r)·B·A` of the adapter being trained — the same arithmetic as peft's merge, which is how an
adapter saved at that step is served or replayed, rounded to the sampling dtype when that is
narrower (the trainer's importance weights correct what the rounding changes). `refresh()` after
each optimizer step rewrites the merged weights in place; for full fine-tuning in the trainer's
own dtype the trained model is its own snapshot.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer

from reprorl.trainer.local import LocalTrainer

PEFT_PREFIX = "base_model.model."


class SamplingSnapshot:
    """What the sampler reads: the trained weights as one plain model, refreshed between steps."""

    def __init__(
        self, trainer: LocalTrainer, dtype: torch.dtype | None = None, *, always_copy: bool = False
    ) -> None:
        """`always_copy`: keep a copy even when the trained model could serve itself, so sampling can
        go on while the trainer updates (asynchronous training)."""
        self.trainer = trainer
        model = trainer.model
        trained_dtype = next(model.parameters()).dtype
        self.copied = (
            always_copy
            or isinstance(model, PeftModel)
            or (dtype is not None and dtype != trained_dtype)
            or trainer.device.type != "cpu"
        )
        if self.copied:
            plain: Any = copy.deepcopy(model)
            if isinstance(plain, PeftModel):
                plain = plain.merge_and_unload()
            plain.requires_grad_(False)
            plain.train(False)
            plain = plain.to("cpu")  # the local sampler decodes on the CPU, wherever training runs
            self.model: Any = plain.to(dtype) if dtype is not None else plain
        else:
            self.model = model
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Write the trainer's current weights into the snapshot (in place: the sampler repacks them)."""
        model = self.trainer.model
        if not self.copied:
            return
        if not isinstance(model, PeftModel):
            for mine, trained in zip(self.model.parameters(), model.parameters(), strict=True):
                mine.copy_(trained)
            return
        for name, module in model.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            target = self.model.get_submodule(name.removeprefix(PEFT_PREFIX))
            merged = module.get_base_layer().weight.detach().clone()
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    merged += module.get_delta_weight(adapter)
            target.weight.copy_(merged)
