"""Finding the checkpoint folder a path means, and which layout it holds.

A path is a save folder (`latest` names a `global_stepN` tag: DeepSpeed, mds-train,
Megatron-DeepSpeed; `latest_checkpointed_iteration.txt` names `iter_NNNNNNN` or `release`: plain
Megatron) or one checkpoint folder itself. `--iteration N` picks `global_stepN` / `iter_NNNNNNN`
instead of the newest. deepspeedai's Megatron-DeepSpeed writes both pointers, naming the same
checkpoint (`global_step10` and `10`); where its `latest` is gone, the tracker's N is read as
`global_stepN` when that folder is there and `iter_NNNNNNN` is not.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from .layout import (
    DEEPSPEED_TAG,
    LATEST,
    LAYER_FILE,
    MEGATRON_FILE,
    MEGATRON_RANK_DIR,
    MEGATRON_RELEASE,
    MEGATRON_TRACKER,
    MP_RANK_FILE,
    ZERO3_MODEL_FILE,
    tag_for,
    tag_iteration,
    tracker_tag,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Located:
    folder: Path  # global_stepN, iter_NNNNNNN, release, or the folder given
    kind: str  # "deepspeed" (layer and/or mp_rank files) or "megatron" (mp_rank_XX[_YYY] dirs)


def _kind_of(folder: Path) -> str | None:
    if not folder.is_dir():
        return None
    names = [p.name for p in folder.iterdir()]
    if any(
        MP_RANK_FILE.fullmatch(n) or LAYER_FILE.fullmatch(n) or ZERO3_MODEL_FILE.fullmatch(n)
        for n in names
    ):
        return "deepspeed"
    if any(
        MEGATRON_RANK_DIR.fullmatch(n) and (folder / n / MEGATRON_FILE).is_file() for n in names
    ):
        return "megatron"
    return None


def _tag_folder(base: Path, iteration: int) -> Path | None:
    for name in (tag_for(iteration), tag_for(iteration, "megatron")):
        if (base / name).is_dir():
            return base / name
    return None


def locate_checkpoint(path: Path, *, iteration: int | None = None) -> Located:
    """The checkpoint folder `path` means; ValueError with one line when there is none."""
    if not path.exists():
        raise ValueError(f"{path}: no such checkpoint folder")
    if not path.is_dir():
        raise ValueError(
            f"{path}: not a folder; give a checkpoint save folder or a global_stepN one"
        )
    if iteration is not None:
        folder = _tag_folder(path, iteration)
        if folder is None:
            kind = _kind_of(path)
            if kind is not None and tag_iteration(path.name) == iteration:
                return Located(path, kind)
            raise ValueError(
                f"{path}: no checkpoint of iteration {iteration} (neither "
                f"{tag_for(iteration)} nor {tag_for(iteration, 'megatron')})"
            )
        return _checked(folder)
    kind = _kind_of(path)
    if kind is not None:
        return Located(path, kind)
    if (path / LATEST).is_file():
        tag = (path / LATEST).read_text().strip()
        folder = path / tag
        if not tag or not folder.is_dir():
            what = "is empty" if not tag else f"names {tag!r}, which is not a folder in {path}"
            raise ValueError(f"{path / LATEST}: {what}; {_repair(path, 'name')}")
        return _checked(folder)
    if (path / MEGATRON_TRACKER).is_file():
        return _checked(_tracker_folder(path))
    from .hf_folder import is_hf_model_folder, missing_config  # torch: only on the way to an error

    hugging_face = missing_config(path)
    if hugging_face is not None:
        raise ValueError(hugging_face)
    if is_hf_model_folder(path):
        raise ValueError(
            f"{path}: a Hugging Face model folder, not a training checkpoint; convert it with "
            f"mds-merge-mp import-hf --load {path} --save DIR (mds-generate reads it as it is)"
        )
    raise ValueError(
        f"{path}: not a checkpoint (no {LATEST} or {MEGATRON_TRACKER} file, and no mp_rank_* or "
        "layer_* files); give the --save folder of a training run or one global_stepN folder"
    )


def _tracker_folder(path: Path) -> Path:
    """The folder Megatron's tracker names: `iter_NNNNNNN` (or `release`), else, beside no
    `latest`, the `global_stepN` of the same iteration that Megatron-DeepSpeed wrote."""
    tracker = path / MEGATRON_TRACKER
    text = tracker.read_text().strip()
    if text != MEGATRON_RELEASE and not text.isdigit():
        raise ValueError(f"{tracker}: {text!r} is not an iteration number")
    folder = path / tracker_tag(text)
    if folder.is_dir():
        return folder
    if text == MEGATRON_RELEASE:
        raise ValueError(
            f"{tracker}: names {MEGATRON_RELEASE}, but {path} has no {MEGATRON_RELEASE} folder; "
            f"{_repair(path, 'iteration')}"
        )
    deepspeed = path / tag_for(int(text))
    if not deepspeed.is_dir():
        raise ValueError(
            f"{tracker}: names iteration {int(text)}, but {path} holds neither {folder.name} nor "
            f"{deepspeed.name}; {_repair(path, 'iteration')}"
        )
    logger.info(
        "%s: no %s beside %s, which names iteration %d; reading %s",
        path, LATEST, MEGATRON_TRACKER, int(text), deepspeed.name,
    )  # fmt: skip
    return deepspeed


def _repair(path: Path, what: str) -> str:
    """What to do about a pointer that names no checkpoint folder (a crash while it was written,
    a hand edit, a folder deleted since): `latest` takes the `name` of a global_stepN folder, the
    tracker the `iteration` of an iter_NNNNNNN or global_stepN one."""
    steps = {
        tag_iteration(p.name): p.name
        for p in sorted(path.iterdir())
        if p.is_dir()
        and tag_iteration(p.name) is not None
        and (what == "iteration" or DEEPSPEED_TAG.fullmatch(p.name))
    }
    newest = f" (the newest is {steps[max(steps)]})" if steps else ""
    return f"write the {what} of a checkpoint folder into it{newest}, or give that folder itself"


def _checked(folder: Path) -> Located:
    kind = _kind_of(folder)
    if kind is None:
        raise ValueError(
            f"{folder}: holds no checkpoint files (no mp_rank_* or layer_* files, no "
            f"mp_rank_XX/{MEGATRON_FILE})"
        )
    return Located(folder, kind)
