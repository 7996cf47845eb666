"""Policy-gradient and supervised losses on tensors: one file per method, the paper named at its top.

Each policy-gradient loss registers itself (`register_loss`) with the config its file declares, so
`learning.loss = { kind = ... }` selects it by name, and each group advantage estimator registers its
class (`register_advantage`), so `learning.advantage = "..."` does; importing this package registers
the built-ins.
"""

from reprorl.algos.base import Loss, LossOutput, TokenBatch, masked_mean, sequence_mean, sequence_means
from reprorl.algos.cispo import CISPO, CISPOConfig
from reprorl.algos.dr_grpo import DrGRPOAdvantage
from reprorl.algos.grpo import GRPOAdvantage
from reprorl.algos.gspo import GSPO, GSPOConfig
from reprorl.algos.importance import Correction, MaskedIS, NoCorrection, TruncatedIS
from reprorl.algos.kl import ESTIMATORS, k1, k2, k3
from reprorl.algos.ppo import ClipBounds, PPOClip, PPOClipConfig
from reprorl.algos.ppo_ewma import PPOEWMA, PPOEWMAConfig
from reprorl.algos.raft import RAFTAdvantage
from reprorl.algos.registered import LossShared, build_loss, register_advantage, register_loss
from reprorl.algos.reinforce import Reinforce, ReinforceConfig
from reprorl.algos.rloo import RLOOAdvantage
from reprorl.algos.sft import CrossEntropy

__all__ = [
    "CISPO",
    "ESTIMATORS",
    "GSPO",
    "PPOEWMA",
    "CISPOConfig",
    "ClipBounds",
    "Correction",
    "CrossEntropy",
    "DrGRPOAdvantage",
    "GRPOAdvantage",
    "GSPOConfig",
    "Loss",
    "LossOutput",
    "LossShared",
    "MaskedIS",
    "NoCorrection",
    "PPOClip",
    "PPOClipConfig",
    "PPOEWMAConfig",
    "RAFTAdvantage",
    "RLOOAdvantage",
    "Reinforce",
    "ReinforceConfig",
    "TokenBatch",
    "TruncatedIS",
    "build_loss",
    "k1",
    "k2",
    "k3",
    "masked_mean",
    "register_advantage",
    "register_loss",
    "sequence_mean",
    "sequence_means",
]
