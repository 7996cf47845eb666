"""Exporting a run's adapter as a plain peft folder that any peft user can load, its identity kept aside.

A stored adapter names its base model by hash (`base_model_name_or_path = "sha256:…"`), which is
what reprorl checks and what no other tool can load. The export writes the same weights with
`base_model_name_or_path` set to a local folder holding the base in Hugging Face format (the
store's converted copy, or one written into the export with `copy_base`), so
`AutoPeftModelForCausalLM.from_pretrained(folder)` works, and keeps reprorl's identity of both in
`reprorl.json` beside them. The folder is staged and renamed: a failed export leaves nothing.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from reprorl.config.load import stored_spec
from reprorl.errors import RecordError, UserInputError
from reprorl.policy import LoadedModel, adapter_hash, load_base, save_model
from reprorl.policy.lora import adapter_base
from reprorl.store import Store, find_run

METADATA = "reprorl.json"


@dataclass(frozen=True)
class ExportedAdapter:
    """Where the export went and what it is."""

    folder: str
    run_id: str
    adapter_hash: str  # the stored adapter's hash (the policy version its samples record)
    base_model_hash: str
    base_model_path: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def export_adapter(store: Store, run: str, out: Path, *, copy_base: bool = False) -> ExportedAdapter:
    """Write run `run`'s final adapter to `out` as a loadable peft folder."""
    record = find_run(store, run)
    source = record.path / "adapter"
    if not (source / "adapter_config.json").is_file():
        raise UserInputError(
            f"run {record.run_id} has no saved adapter (it trained the whole model, or did not finish)",
            field="RUN",
        )
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserInputError(f"{str(out)!r} exists and is not an empty folder; name a new one", field="--out")
    recorded = adapter_base(source)
    spec = stored_spec(record.spec())
    loaded = load_base(str(spec.model.base), store=store)
    if recorded is not None and loaded.base_hash != recorded:
        raise RecordError(
            f"run {record.run_id}: its adapter was trained on {recorded}, but its spec's base loads as "
            f"{loaded.base_hash}"
        )
    staging = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
        base_path = _base_folder(loaded, staging, out, copy_base)
        for item in source.iterdir():
            if item.name != "adapter_config.json":
                shutil.copy2(item, staging / item.name)
        config = json.loads((source / "adapter_config.json").read_text())
        config["base_model_name_or_path"] = base_path
        (staging / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        exported = ExportedAdapter(str(out), record.run_id, adapter_hash(source), loaded.base_hash, base_path)
        (staging / METADATA).write_text(json.dumps(exported.to_json(), indent=2, sort_keys=True) + "\n")
        if out.exists():
            out.rmdir()  # empty, checked above
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return exported


def _base_folder(loaded: LoadedModel, staging: Path, out: Path, copy: bool) -> str:
    """The base as a Hugging Face folder: the store's converted copy, or one written into the export."""
    if not copy and loaded.path is not None and (loaded.path / "config.json").is_file():
        return str(loaded.path.resolve())
    save_model(loaded.model, loaded.tokenizer, staging / "base")
    return str(out / "base")
