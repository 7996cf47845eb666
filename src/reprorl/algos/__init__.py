"""Policy-gradient and supervised losses on tensors: one file per method, the paper named at its top."""

from reprorl.algos.base import LossOutput, TokenBatch
from reprorl.algos.sft import CrossEntropy

__all__ = ["CrossEntropy", "LossOutput", "TokenBatch"]
