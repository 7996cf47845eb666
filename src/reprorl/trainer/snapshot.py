"""The sampling snapshot: a plain model holding the trainer's current weights, with the adapter merged in.

The rollout side samples from a model without adapter layers, so every sampled token costs what it
costs on the base (the fused decode path applies), and the weights it reads are exactly
`W + (alpha/r)·B·A` of the adapter being trained — the same arithmetic as peft's merge, which is how an
adapter saved at that step is served or replayed. `refresh()` after each optimizer step rewrites
the merged weights in place; for full fine-tuning the trained model is its own snapshot.
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

    def __init__(self, trainer: LocalTrainer) -> None:
        self.trainer = trainer
        model = trainer.model
        if isinstance(model, PeftModel):
            merged = copy.deepcopy(model).merge_and_unload()
            merged.requires_grad_(False)
            merged.train(False)
            self.model: Any = merged
        else:
            self.model = model
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Write the trainer's current weights into the snapshot (in place: the sampler repacks them)."""
        model = self.trainer.model
        if not isinstance(model, PeftModel):
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
