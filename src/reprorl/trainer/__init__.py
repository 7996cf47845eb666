"""Training: the local backend's primitives, training data from trajectories, and training stages."""

from reprorl.trainer.data import Datum, collate, from_trajectory
from reprorl.trainer.local import AdamParams, LocalTrainer

__all__ = ["AdamParams", "Datum", "LocalTrainer", "collate", "from_trajectory"]
