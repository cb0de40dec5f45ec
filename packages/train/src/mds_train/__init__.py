"""mds-train: the DeepSpeed GPT trainer with Megatron-DeepSpeed's flags (TP, PP, ZeRO)."""

from mds_train.config import TrainConfig
from mds_train.schedule import BatchSizeSchedule, LearningRateSchedule

__all__ = ["BatchSizeSchedule", "LearningRateSchedule", "TrainConfig"]
