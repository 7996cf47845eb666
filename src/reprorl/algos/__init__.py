"""Policy-gradient and supervised losses on tensors: one file per method, the paper named at its top."""

from reprorl.algos.base import Loss, LossOutput, TokenBatch, masked_mean
from reprorl.algos.dr_grpo import DrGRPOAdvantage
from reprorl.algos.grpo import GRPOAdvantage
from reprorl.algos.importance import Correction, MaskedIS, NoCorrection, TruncatedIS
from reprorl.algos.kl import ESTIMATORS, k1, k2, k3
from reprorl.algos.ppo import PPOClip
from reprorl.algos.ppo_ewma import PPOEWMA
from reprorl.algos.reinforce import Reinforce
from reprorl.algos.rloo import RLOOAdvantage
from reprorl.algos.sft import CrossEntropy

__all__ = [
    "ESTIMATORS",
    "PPOEWMA",
    "Correction",
    "CrossEntropy",
    "DrGRPOAdvantage",
    "GRPOAdvantage",
    "Loss",
    "LossOutput",
    "MaskedIS",
    "NoCorrection",
    "PPOClip",
    "RLOOAdvantage",
    "Reinforce",
    "TokenBatch",
    "TruncatedIS",
    "k1",
    "k2",
    "k3",
    "masked_mean",
]
