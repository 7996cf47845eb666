"""The policy layer: base models, tokenizers and chat templates, LoRA adapters, and their hashes.

Importing it turns the Hugging Face libraries offline for the whole process: models come from
local files (the bundled GGUF, model folders, the artifact store) and nothing is downloaded. It
also fixes glibc's malloc thresholds (`heap.py`), so a long run's memory is returned as it is freed,
and has MKL choose its vector math code paths in this thread (`vector_math.py`), so a first forward
pass computes what every later one does.
"""

import os

# Set before transformers is first imported, which reads these once; every load below also
# passes local_files_only=True, which holds even when transformers was imported earlier.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

from reprorl.policy.digest import file_hash, tensors_hash, text_hash, tree_hash
from reprorl.policy.gguf import BUNDLED_NAME, bundled_gguf, bundled_hash, load_gguf
from reprorl.policy.heap import bound_heap
from reprorl.policy.load import DEFAULT_BASE, default_cache_root, load_base, load_tokenizer
from reprorl.policy.lora import (
    ATTENTION_PROJECTIONS,
    adapter_hash,
    apply_lora,
    apply_lora_spec,
    load_adapter,
    save_adapter,
)
from reprorl.policy.models import LoadedModel, export_safetensors, load_folder, save_model
from reprorl.policy.tiny import TinyModelConfig, tiny_model
from reprorl.policy.tiny_tokenizer import CHAT_TEMPLATE, build_tokenizer
from reprorl.policy.vector_math import resolve_vector_math

bound_heap()
resolve_vector_math()

__all__ = [
    "ATTENTION_PROJECTIONS",
    "BUNDLED_NAME",
    "CHAT_TEMPLATE",
    "DEFAULT_BASE",
    "LoadedModel",
    "TinyModelConfig",
    "adapter_hash",
    "apply_lora",
    "apply_lora_spec",
    "build_tokenizer",
    "bundled_gguf",
    "bundled_hash",
    "default_cache_root",
    "export_safetensors",
    "file_hash",
    "load_adapter",
    "load_base",
    "load_folder",
    "load_gguf",
    "load_tokenizer",
    "save_adapter",
    "save_model",
    "tensors_hash",
    "text_hash",
    "tiny_model",
    "tree_hash",
]
