"""meta.json, the description mds writes into every checkpoint folder, as one typed record.

`CheckpointMeta.to_json()` is what mds-train and mds-merge-mp write; `CheckpointMeta.from_json`
reads every version written so far; a checkpoint without one (Megatron, Megatron-DeepSpeed) gets
a record built from its own files (`source.py`). Its keys are the Megatron flags' names for the
same quantities (`tensor_model_parallel_size`, as `--tensor-model-parallel-size`). Torch-free.

Versions (`checkpoint_version`, mds's own, unrelated to Megatron's 3.0 in the rank files):
- 1: `parallel` spelled `tensor_parallel`, `pipeline_parallel`, `data_parallel`.
- 2: `parallel` spelled as the flags; everything else as 1.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mds_common.tokenizer_record import TokenizerRecord

from .layout import META

if TYPE_CHECKING:
    from mds_model import GPTConfig

FORMAT = "mds-train checkpoint"
VERSION = 2
# meta.json's `layout`: whose files hold the weights (source.py, mds_train.upstream).
MDS_LAYOUT = "mds"
UPSTREAM_LAYOUT = "upstream"  # Megatron-DeepSpeed's own files, loaded by mds-train as they are
# Version 1's spellings of `parallel`'s keys.
_PARALLEL_V1 = {
    "tensor_parallel": "tensor_model_parallel_size",
    "pipeline_parallel": "pipeline_model_parallel_size",
    "data_parallel": "data_parallel_size",
}


@dataclass(frozen=True)
class Parallel:
    """The topology that wrote the files. `engine`: "plain" (DeepSpeed's engine around the
    whole model), "pipeline" (its PipelineEngine: layer files) or "megatron" (no DeepSpeed)."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    data_parallel_size: int | None = None  # None: not recorded (Megatron's args)
    world_size: int | None = None
    zero_stage: int = 0
    engine: str = "plain"

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> Parallel:
        renamed = {_PARALLEL_V1.get(key, key): value for key, value in values.items()}
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in renamed.items() if key in names})


@dataclass
class Progress:
    """How far training went: the counters a resume continues from (mds_train's TrainingState
    is this record, updated in place)."""

    iteration: int = 0
    consumed_train_samples: int = 0
    consumed_valid_samples: int = 0
    consumed_train_tokens: int = 0
    lr_samples: int = 0  # AnnealingLR's num_steps: samples of the steps that were applied
    # OptimizerParamScheduler's num_tokens: the tokens consumed before the last applied step's
    # iteration (upstream's step() reads them before its loop counts the iteration's).
    lr_tokens: int = 0
    # Its lr_warmup_tokens as recorded when a warmup in samples ends (a token decay reads it);
    # None until then, which is not a count of 0.
    lr_warmup_end_tokens: int | None = None
    skipped_iterations: int = 0
    nan_iterations: int = 0

    def to_dict(self) -> dict[str, int | None]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]):
        """The counters among `values` (a meta.json, a client state); others are ignored."""
        return cls(
            **{
                name: None if values[name] is None else int(values[name])
                for name in PROGRESS_FIELDS
                if name in values
            }
        )


PROGRESS_FIELDS = tuple(f.name for f in dataclasses.fields(Progress))


@dataclass(frozen=True)
class CheckpointMeta:
    """A checkpoint's description. `model` is meta.json's model section: every GPTConfig field
    plus the derived sizes (`model_fields`); `config()` reads it back."""

    model: dict[str, Any]
    parallel: Parallel
    precision: str | None = None
    progress: Progress = field(default_factory=Progress)
    # The tokenizer's record (mds_common.tokenizer_record) with the vocabulary size trained on;
    # `megatron_tokenizer` what Megatron's args said instead (their tokenizer_type and files).
    tokenizer: TokenizerRecord | None = None
    megatron_tokenizer: TokenizerRecord | None = None
    # The scheduler's state_dict as upstream's OptimizerParamScheduler holds it.
    lr_schedule: dict[str, Any] | None = None
    data_path: list[str] | None = None
    tool: str | None = None
    version: str | None = None  # the writing tool's distribution version
    versions: dict[str, str] | None = None  # mds-model, deepspeed, torch
    tag: str | None = None
    layout: str = MDS_LAYOUT
    # mds-merge-mp's records: where the weights came from, and the optimizer state it wrote
    # (`layout` "universal", and an fp16 source's `loss_scaler`), None for weights only.
    reshaped: dict[str, Any] | None = None
    optimizer: dict[str, Any] | None = None
    checkpoint_version: int = VERSION

    @property
    def iteration(self) -> int:
        return self.progress.iteration

    @property
    def tensor_model_parallel_size(self) -> int:
        return self.parallel.tensor_model_parallel_size

    @property
    def pipeline_model_parallel_size(self) -> int:
        return self.parallel.pipeline_model_parallel_size

    @property
    def optimizer_layout(self) -> str | None:
        """ "universal" when mds-merge-mp wrote the optimizer state topology-free."""
        return (self.optimizer or {}).get("layout")

    def config(self, *, where: str) -> GPTConfig:
        from .describe import config_from_meta

        return config_from_meta(self.model, where=where)

    def tokenizer_record(self) -> TokenizerRecord:
        """The tokenizer the checkpoint names: mds's record, else Megatron's args'; an empty
        record if none."""
        return self.tokenizer or self.megatron_tokenizer or TokenizerRecord()

    def replace(self, **changes: Any) -> CheckpointMeta:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """meta.json's content (the current version); records that are None are left out,
        except the tokenizer's (None: the checkpoint names none) and, in mds-merge-mp's outputs,
        the optimizer's (None: weights only)."""
        content: dict[str, Any] = {
            "format": FORMAT,
            "checkpoint_version": VERSION,
            "tool": self.tool,
            "version": self.version,
            "versions": self.versions,
            "model": self.model,
            "parallel": dataclasses.asdict(self.parallel),
            "precision": self.precision,
            "tokenizer": _tokenizer_json(self.tokenizer),
            "megatron_tokenizer": _tokenizer_json(self.megatron_tokenizer),
            "data_path": self.data_path,
            "lr_schedule": self.lr_schedule,
            **self.progress.to_dict(),
            "tag": self.tag,
            "layout": self.layout,
            "reshaped": self.reshaped,
            "optimizer": self.optimizer,
        }
        kept = ("tokenizer", "lr_warmup_end_tokens", *(("optimizer",) if self.reshaped else ()))
        return {key: value for key, value in content.items() if value is not None or key in kept}

    @classmethod
    def from_json(cls, content: Any, *, where: str) -> CheckpointMeta:
        """A meta.json's content, of any version; ValueError naming `where` when it is not one."""
        if (
            not isinstance(content, dict)
            or content.get("format") != FORMAT
            or not isinstance(content.get("model"), dict)
            or not isinstance(content.get("parallel"), dict)
        ):
            raise ValueError(f"{where}: not an mds-train checkpoint description")
        version = content.get("checkpoint_version", 1)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(
                f"{where}: checkpoint_version {version!r} is not one mds writes (1 to {VERSION})"
            )
        if version > VERSION:
            raise ValueError(
                f"{where}: checkpoint_version {version!r} is newer than this mds reads "
                f"({VERSION}); upgrade mds"
            )
        typed = {"parallel", "progress", "checkpoint_version", *_TOKENIZERS}
        names = {f.name for f in dataclasses.fields(cls)} - typed
        tokenizers = {
            key: _tokenizer(content.get(key), key=key, where=where) for key in _TOKENIZERS
        }
        return cls(
            parallel=Parallel.from_json(content["parallel"]),
            progress=Progress.from_dict(content),
            checkpoint_version=version,
            **tokenizers,
            **{key: content[key] for key in names if key in content},
        )


_TOKENIZERS = ("tokenizer", "megatron_tokenizer")


def _tokenizer(value: Any, *, key: str, where: str) -> TokenizerRecord | None:
    if value is None:
        return None
    try:
        return TokenizerRecord.from_json(value)
    except ValueError as error:
        raise ValueError(f"{where}: {key}: {error}") from None


def _tokenizer_json(record: TokenizerRecord | None) -> dict[str, Any] | None:
    return None if record is None else record.to_json()


def read_meta(folder: Path) -> CheckpointMeta | None:
    """The folder's meta.json, or None when it has none; ValueError with one line when it is not
    valid JSON or not a checkpoint description."""
    path = folder / META
    if not path.is_file():
        return None
    try:
        content = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    return CheckpointMeta.from_json(content, where=str(path))


def meta_text(meta: CheckpointMeta) -> str:
    return json.dumps(meta.to_json(), indent=2, default=str) + "\n"


def model_fields(config: GPTConfig) -> dict[str, Any]:
    """meta.json's `model`: every GPTConfig field and the derived sizes."""
    fields = dataclasses.asdict(config)
    fields.update(
        ffn_size=config.ffn_size,
        padded_vocab_size=config.padded_vocab_size,
        max_positions=config.max_positions,
    )
    return fields
