"""Hugging Face folders (`config.json` + `model.safetensors`) to and from checkpoints, for each
family mds builds: GPT2LMHeadModel, LlamaForCausalLM, GPTNeoXForCausalLM, BloomForCausalLM.

export-hf: the checkpoint consolidated to TP=1, converted by its family's adapter
(`mds_model.hf_families.hf_adapter`: padding rows dropped, names and cuts of `parameters.py`'s
table) and written with `safetensors` (a tied head left out, as `save_pretrained` writes it), so
`from_pretrained` loads it with no missing or unexpected keys. A layout no family holds is
refused in one line. import-hf: the reverse (the family by config.json's model_type), written as
an mds-train checkpoint at any TP/PP (iteration 0, no optimizer state), one part at a time (the
weights are read a tensor per lookup, `hf_folder.HFWeights`); meta.json records the tokenizer the
flags name, as upstream's converter reads them, else the folder's own.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mds_common.files import atomic_directory, reporting_write_failures
from mds_common.tokenizer_record import GPT2_BPE, TokenizerRecord
from mds_model import GPTConfig
from mds_model.hf_families import HFAdapter, hf_adapter, hf_adapter_of_folder

from .arrays import as_array
from .config import ExportConfig, ImportConfig
from .consolidate import consolidate
from .hf_folder import (
    CONFIG,
    SAFETENSORS,
    TOKENIZER_FILES,
    HFWeights,
    gpt_config_from_hf,
    hf_folder_tokenizer,
    read_hf_config,
)
from .layout import LATEST, tag_for
from .meta import CheckpointMeta, Parallel
from .output import check_save_folder, output_meta, target_config, write_meta
from .source import open_source
from .upstream_state import tokenizer_eod_id
from .writer import new_save_folder

if TYPE_CHECKING:  # the model and its kernels load only with --verify
    from .verify import Verification

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportResult:
    folder: Path
    num_tensors: int
    verification: Verification | None  # with --verify
    architecture: str = "GPT2LMHeadModel"  # config.json's architectures[0]


def _adapter(config: GPTConfig, where: Path) -> HFAdapter:
    try:
        return hf_adapter(config)
    except ValueError as problem:
        raise ValueError(f"{where}: {problem}; not exported") from None


def export_hf(config: ExportConfig) -> ExportResult:
    from safetensors.torch import save_file

    source = open_source(config.load, iteration=config.iteration)
    adapter = _adapter(source.config, source.folder)
    model = consolidate(source)
    tokenizer = _export_tokenizer(config, model.meta.tokenizer_record(), model.config)
    eos = config.eos_token_id
    if eos is None:
        eos = tokenizer_eod_id(tokenizer)
        if eos is not None and eos >= model.config.vocab_size:  # GPT-2's id, files not at hand
            logger.info(
                "the tokenizer's end-of-document id %d is past the model's %d-token vocabulary "
                "(its files are not at hand): eos_token_id left unset; give --vocab-file and "
                "--merge-file, or --eos-token-id",
                eos,
                model.config.vocab_size,
            )
            eos = None
    elif not 0 <= eos < model.config.vocab_size:
        raise ValueError(
            f"--eos-token-id {eos}: not an id of the model's vocabulary (0 to "
            f"{model.config.vocab_size - 1}); give its end-of-document id, or drop the flag"
        )
    hf_config = adapter.hf_config(model.config, eos_token_id=eos)
    hf_config["torch_dtype"] = model.config.params_dtype
    state = adapter.to_hf(model.state_dict, model.config)
    _check_hf_folder(config.save)
    verification = None
    with atomic_directory(config.save) as staging:
        # Inside the atomic folder: a failed write is measured before its partial files go.
        with reporting_write_failures(
            config.save,
            doing="writing",
            advice="give --save another folder",
            writer_error=_safetensors_error,
        ):
            (staging / CONFIG).write_text(json.dumps(hf_config, indent=2) + "\n")
            save_file(state, str(staging / SAFETENSORS), metadata={"format": "pt"})
            # safetensors writes through a private temporary file (mode 0600) and renames it;
            # the weights get the mode open() gave config.json (0666 less the umask).
            shutil.copymode(staging / CONFIG, staging / SAFETENSORS)
            _copy_tokenizer(tokenizer, staging)
        if config.verify:
            from .verify import verify

            verification = verify(model, _consolidated_from_hf(staging))
    return ExportResult(config.save, len(state), verification, adapter.architecture)


def _export_tokenizer(
    config: ExportConfig, recorded: TokenizerRecord, model: GPTConfig
) -> TokenizerRecord:
    """The tokenizer that goes beside the weights: --vocab-file/--merge-file, else the one the
    checkpoint names (meta.json's record, or Megatron's args). Files read here must be the
    checkpoint's tokenizer, each id with a row of the model (mds_tokenize's one check)."""
    from mds_tokenize import (
        TokenizerSpec,
        check_checkpoint_tokenizer,
        load_tokenizer,
        spec_from_record,
    )

    if config.vocab_file is not None:
        spec = TokenizerSpec(
            tokenizer_type=GPT2_BPE, vocab_file=config.vocab_file, merge_file=config.merge_file
        )
    elif recorded.files_at_hand:
        spec = spec_from_record(recorded)
    else:
        return recorded  # nothing here to read: exported without it (_copy_tokenizer)
    given = load_tokenizer(spec).record()
    check_checkpoint_tokenizer(
        recorded, given, checkpoint=f"--load {config.load}", model_rows=model.vocab_size
    )
    return given


def _safetensors_error(error: BaseException) -> bool:
    """safetensors reports a failed write as its own error, the OS error quoted inside."""
    from safetensors import SafetensorError

    return isinstance(error, SafetensorError)


def _copy_tokenizer(recorded: TokenizerRecord, folder: Path) -> None:
    """The checkpoint's tokenizer files, under the names a Hugging Face folder uses, so that the
    folder is whole (mds-generate and `transformers` find them there); skipped with a note when
    meta.json names none or they are gone."""
    sources = list(zip(recorded.files, TOKENIZER_FILES.get(recorded.kind, ()), strict=True))
    if not sources or any(not path or not Path(path).is_file() for path, _ in sources):
        logger.info("the checkpoint's tokenizer files are not at hand; exported without them")
        return
    for path, name in sources:
        shutil.copyfile(path, folder / name)


def _check_hf_folder(save: Path) -> None:
    """An existing folder is replaced only when it holds nothing but an earlier export."""
    exported = {CONFIG, SAFETENSORS, *(n for names in TOKENIZER_FILES.values() for n in names)}
    if save.is_dir() and {p.name for p in save.iterdir()} - exported:
        raise ValueError(f"--save {save}: folder exists with other files; choose a new folder")
    if save.exists() and not save.is_dir():
        raise ValueError(f"--save {save}: exists and is not a folder")


def _consolidated_from_hf(folder: Path):
    from .consolidate import ConsolidatedModel

    hf = read_hf_config(folder)
    adapter, config = hf_adapter_of_folder(hf), gpt_config_from_hf(hf)
    weights = HFWeights(folder, adapter.model_type)
    return ConsolidatedModel(config, {}, adapter.from_hf(weights, config))


def import_hf(config: ImportConfig) -> Path:
    hf_config = read_hf_config(config.load)
    adapter = hf_adapter_of_folder(hf_config)
    try:
        model = gpt_config_from_hf(
            hf_config,
            make_vocab_size_divisible_by=config.make_vocab_size_divisible_by,
            seq_length=config.seq_length,
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{config.load / CONFIG}: {error}") from None
    target = target_config(
        model,
        tensor_model_parallel_size=config.target_tensor_model_parallel_size,
        pipeline_model_parallel_size=config.target_pipeline_model_parallel_size,
    )
    tokenizer = _import_tokenizer(config, target, eos=hf_config.get("eos_token_id"))
    if tokenizer.vocab_size is not None and tokenizer.vocab_size > target.vocab_size:
        # The named tokenizer's ids are the model's vocabulary (GPTConfig.vocab_size), as a run
        # with its flags writes it: export-hf keeps their rows. The padded rows stay the same.
        target = dataclasses.replace(target, vocab_size=tokenizer.vocab_size)
    weights = HFWeights(config.load, adapter.model_type)
    check_save_folder(config.save)
    tag = tag_for(0)
    with new_save_folder(
        config.save,
        tag,
        config=target,
        tensor_model_parallel_size=config.target_tensor_model_parallel_size,
        pipeline_model_parallel_size=config.target_pipeline_model_parallel_size,
    ) as (staging, writer):
        folder = writer.folder
        try:
            for part in adapter.from_hf_parts(weights, model):  # one part in memory at a time
                writer.write_part({name: as_array(tensor) for name, tensor in part.items()})
        except ValueError as error:
            raise ValueError(f"{config.load}: {error}") from None
        base = CheckpointMeta(model={}, parallel=Parallel(), tokenizer=tokenizer)
        writer.finish(base.progress.to_dict(), tokenizer=base.tokenizer)
        layout = f"huggingface-{adapter.model_type}"
        provenance = {"from": str(config.load.resolve()), "layout": layout}
        write_meta(
            folder,
            output_meta(
                base,
                target,
                tensor_model_parallel_size=config.target_tensor_model_parallel_size,
                pipeline_model_parallel_size=config.target_pipeline_model_parallel_size,
                tag=tag,
                reshaped={**provenance, "rng_states": False},
                optimizer=None,
            ),
        )
        (staging / LATEST).write_text(tag)
    return config.save / tag


def _import_tokenizer(
    config: ImportConfig, model: GPTConfig, *, eos: int | None
) -> TokenizerRecord:
    """meta.json's `tokenizer`, as mds-train records its own (`vocab_size`: the rows its ids
    take, `eod_id`), so that a run naming the same tokenizer loads the import unchallenged. The
    tokenizer flags' (upstream's converter reads the script's, e.g. HFTokenizer, which adds a
    `[PAD]` id where the tokenizer sets no pad token), each id with one of the model's embedding
    rows; else the folder's own (tokenizer.json as PretrainedFromHF, else vocab.json +
    merges.txt) with config.json's size and eos id."""
    spec = config.tokenizer()
    if spec is None:
        recorded = hf_folder_tokenizer(config.load) or TokenizerRecord()
        return recorded.updated(vocab_size=model.vocab_size, eod_id=eos)
    from mds_tokenize import load_tokenizer

    given = load_tokenizer(spec).record()
    ids, rows = given.embedding_rows(), model.padded_vocab_size
    if ids > rows:
        raise ValueError(
            f"{config.load / CONFIG}: the model has {rows} embedding rows (vocab_size "
            f"{model.vocab_size}, padded), but the tokenizer flags name {given.label()} with "
            f"{ids} ids; raise --make-vocab-size-divisible-by until the rows hold them, or name "
            "the tokenizer the model was trained with"
        )
    return given.updated(vocab_size=ids)
