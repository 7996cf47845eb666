"""Drawing tokens from logits: one per row by inverse CDF at the row's own uniform, with its logprob.

Token k of a row is the first token whose cumulative (float64) probability exceeds the k-th uniform
times the total; logprobs are under the temperature-scaled distribution before top-k and top-p
filtering (at temperature 0, under the unscaled one), which is what a trainer computes when it
scores the same tokens.
"""

from __future__ import annotations

import torch

from reprorl.types import SamplingParams


def choose(
    logits: torch.Tensor,
    params: list[SamplingParams],
    uniforms: torch.Tensor,
    weights: torch.Tensor,
    top_logprobs: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """One token per row by inverse CDF at its uniform (argmax at temperature 0), and its logprob;
    with `top_logprobs` > 0, also that many most likely tokens' logprobs and ids per row.

    `weights` is scratch of the logits' shape, reused: a fresh vocabulary-wide buffer per step
    costs page faults that add up to more than the arithmetic.
    """
    temperature = torch.tensor([p.temperature for p in params], dtype=logits.dtype)
    greedy = temperature == 0.0
    scaled = logits
    if any(p.temperature not in (0.0, 1.0) for p in params):
        scaled = logits / torch.where(greedy, 1.0, temperature)[:, None]
    top = scaled.amax(dim=-1, keepdim=True)
    torch.sub(scaled, top, out=weights).exp_()
    log_total = top + weights.sum(dim=-1, keepdim=True).log()
    filters: dict[tuple[int, float], list[int]] = {}
    for slot, p in enumerate(params):
        if p.temperature > 0.0 and (p.top_k > 0 or p.top_p < 1.0):
            filters.setdefault((p.top_k, p.top_p), []).append(slot)
    for (top_k, top_p), slots in filters.items():
        weights[slots] = torch.exp(filter_logits(scaled[slots], top_k, top_p) - top[slots])
    tokens = inverse_cdf(weights, uniforms)
    if bool(greedy.any()):
        tokens = torch.where(greedy, scaled.argmax(dim=-1), tokens)
    best = None
    if top_logprobs > 0:
        values, ids = scaled.topk(min(top_logprobs, scaled.shape[-1]), dim=-1)
        best = (values - log_total, ids)
    return tokens, scaled.gather(1, tokens[:, None])[:, 0] - log_total[:, 0], best


def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor, block: int = 256) -> torch.Tensor:
    """Per row, the first token whose cumulative weight exceeds uniform * total, in float64.

    Two levels — the block holding the target, then the token inside it — instead of a
    vocabulary-wide float64 cumsum, which costs more than the rest of a sampling step.
    """
    rows, vocab = weights.shape
    full = vocab - vocab % block
    mass = weights[:, :full].view(rows, -1, block).sum(dim=-1)
    if full < vocab:
        mass = torch.cat([mass, weights[:, full:].sum(dim=-1, keepdim=True)], dim=1)
    mass = mass.double().cumsum(dim=-1)
    total = mass[:, -1:]
    # Strictly below the total, so the draw lands on a token of nonzero weight.
    target = torch.minimum(uniforms[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    at = torch.searchsorted(mass, target, right=True)
    before = torch.where(at > 0, mass.gather(1, (at - 1).clamp(min=0)), 0.0)
    index = at * block + torch.arange(block)
    inside = weights.gather(1, index.clamp(max=vocab - 1)).masked_fill_(index >= vocab, 0.0)
    offset = torch.searchsorted(inside.double().cumsum(dim=-1) + before, target, right=True)
    # Rounding can put the target past the block's own sum: take its last token of nonzero weight.
    last = (inside > 0).long().cumsum(dim=-1).argmax(dim=-1, keepdim=True)
    tokens: torch.Tensor = (at * block + torch.minimum(offset, last))[:, 0]
    return tokens


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k and the top-p nucleus to -inf (0 and 1.0 mean off)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        mass = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        # Drop a token when the mass before it already reaches top_p; the first always stays.
        drop = (mass - torch.softmax(ordered, dim=-1)) >= top_p
        ordered = ordered.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, ordered)
    return logits
