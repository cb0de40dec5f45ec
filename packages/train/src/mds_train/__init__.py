"""mds-train: the DeepSpeed GPT trainer with Megatron-DeepSpeed's flags (TP, PP, ZeRO)."""

# Eager, unlike the other packages' lazy_attributes: both modules are light (typer, mds_model's
# config; no torch or DeepSpeed), and the command line needs TrainConfig to build its flags.
from mds_train.config import TrainConfig
from mds_train.schedule import BatchSizeSchedule, LearningRateSchedule

__all__ = ["BatchSizeSchedule", "LearningRateSchedule", "TrainConfig"]
