"""Opening a policy from stored artifacts: base model, adapter, precision and threads, as records name them.

The same function serves a new run (from its spec) and a replay (from a trajectory's record), so a
replayed rollout is sampled by a policy built exactly the way the original was.
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from reprorl.config import RunSpec
from reprorl.config.spec import RemoteInference
from reprorl.errors import UserInputError
from reprorl.policy import LoadedModel, load_adapter, load_base
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.digest import text_hash
from reprorl.policy.http import HttpSampler
from reprorl.policy.kept import DEFAULT_KEEP_BYTES
from reprorl.policy.sampling import LocalSampler, Sampler
from reprorl.policy.transport import RetryPolicy
from reprorl.rollout.episode import Provenance
from reprorl.store import Store

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def kept_bytes(spec: RunSpec) -> int:
    """The memory `model.kept_cache_mib` gives a sampler for kept caches, in bytes."""
    return spec.model.kept_cache_mib << 20


def torch_dtype(name: str, field: str = "model.sampling_dtype") -> torch.dtype:
    """The torch type of a pinned precision; "auto" is pinned when the spec is resolved, not here."""
    if name not in DTYPES:
        raise UserInputError(
            f"{name!r} is not a pinned precision ({', '.join(DTYPES)}); resolve the spec first "
            "(`resolve_spec` pins 'auto' to this machine's)",
            field=field,
        )
    return DTYPES[name]


@dataclass
class OpenedPolicy:
    """A sampler ready for the rollout runner, and what every trajectory will record about it."""

    loaded: LoadedModel
    sampler: Sampler
    renderer: ChatRenderer
    provenance: Provenance


def chat_template_text(store: Store, spec: RunSpec) -> str | None:
    """The chat template `spec.model.chat_template` names: one UTF-8 Jinja string; None: none set."""
    if spec.model.chat_template is None:
        return None
    ref = str(spec.model.chat_template)
    try:
        text = store.read(ref).decode("utf-8")
    except UnicodeDecodeError:
        raise UserInputError(
            f"{ref} is not UTF-8 text (a Jinja chat template)", field="model.chat_template"
        ) from None
    if not text.strip():
        raise UserInputError(f"{ref} is empty; store a Jinja chat template", field="model.chat_template")
    return text


def with_chat_template(loaded: LoadedModel, template: str | None) -> LoadedModel:
    """`loaded` rendering with `template` instead of its own (unchanged when None)."""
    if template is None:
        return loaded
    loaded.tokenizer.chat_template = template
    return dataclasses.replace(loaded, chat_template_hash=text_hash(template))


def load_run_base(store: Store, spec: RunSpec, base: str | None = None) -> LoadedModel:
    """The base model a run of `spec` trains and samples (`base`: its hash, if already resolved),
    with the spec's `model.chat_template` applied."""
    loaded = load_base(base or str(spec.model.base), store=store)
    return with_chat_template(loaded, chat_template_text(store, spec))


def open_policy(
    store: Store,
    base: str,
    *,
    adapter: str | None = None,
    dtype: str = "float32",
    threads: int | None = None,
    inference: RemoteInference | None = None,
    chat_template: str | None = None,
    keep_bytes: int = DEFAULT_KEEP_BYTES,
) -> OpenedPolicy:
    """Load `base` (a reference or hash in `store`) with an optional stored adapter, for sampling.

    With `inference`, a remote server samples; the base is still loaded here for its tokenizer and
    chat template, which render every prompt. `chat_template`: a template to render with instead
    of the model's own (`chat_template_text`).
    """
    torch_type = torch_dtype(dtype)
    if threads is not None and threads != torch.get_num_threads():
        # Reduction order depends on how the work is split; a replay must split it the same way.
        torch.set_num_threads(threads)
    loaded = with_chat_template(load_base(base, store=store, dtype=torch_type), chat_template)
    adapter_version = None
    policy_version = f"base:{loaded.base_hash}"
    model = loaded.model
    if adapter is not None:
        resolved = store.resolve(adapter)
        with tempfile.TemporaryDirectory(prefix="reprorl-adapter-") as scratch:
            folder = store.export(adapter, Path(scratch) / "adapter")
            peft_model = load_adapter(
                loaded.model, folder, expected_hash=resolved.hash, base_hash=loaded.base_hash
            )
            model = peft_model.merge_and_unload()
        adapter_version = resolved.hash
        policy_version = f"adapter:{resolved.hash}"
    sampler: Sampler
    if inference is None:
        sampler = LocalSampler(
            model,
            loaded.tokenizer,
            model_hash=loaded.base_hash,
            policy_version=policy_version,
            keep_bytes=keep_bytes,
        )
    else:
        sampler = HttpSampler(
            inference.url,
            inference.model,
            policy_version=policy_version,
            timeout_s=inference.timeout_s,
            retry=RetryPolicy(retries=inference.retries),
        )
        # Recorded with every rollout: whether its logprobs are after temperature, as the trainer's.
        sampler.probe_logprobs()
    renderer = ChatRenderer(loaded.tokenizer)
    provenance = Provenance(
        base_model_hash=loaded.base_hash,
        adapter_version=adapter_version,
        prompt_template_hash=renderer.template_hash,
        sampler=sampler.info(),
    )
    return OpenedPolicy(loaded, sampler, renderer, provenance)
