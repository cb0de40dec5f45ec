"""`--tokenizer-type PretrainedFromHF`: any Hugging Face `tokenizer.json`, run by `tokenizers`.

Follows Megatron's `_AutoTokenizer` (README: "Hugging Face tokenizers"): `encode` applies the
tokenizer's post-processor (`add_special_tokens`, as `AutoTokenizer.encode` does), EOD is the eos
token, `decode` keeps special tokens. A local folder or file never imports `transformers`; a hub
name needs it (and the network). `tokenizers` is the optional extra `mds-tokenize[hf]`.

`kind` HFTokenizer is deepspeedai/Megatron-DeepSpeed 6acc370a's `_HFTokenizer` (`--tokenizer-type
HFTokenizer --tokenizer-model X`): the same, but the special tokens the tokenizer's config does not
set (pad `[PAD]`, eos `</s>`, bos `<s>`, unk `<unk>`) are added as special tokens first (upstream's
`add_special_tokens`), and EOD is always the eos token.
"""

import hashlib
import json
import logging
import re
from pathlib import Path

import numpy as np
from mds_common.tokenizer_record import HF_TOKENIZER, TokenizerRecord

from mds_tokenize.interface import FLAG, PRETRAINED_FROM_HF, pack_id_lists

logger = logging.getLogger(__name__)

TOKENIZER_JSON = "tokenizer.json"
# Where transformers keeps the eos token of a saved tokenizer, in the order it reads them.
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
# Tried, in order, when no eos token is configured: GPT-2/NeoX/BLOOM, T5/Llama-2, Llama-3, Gemma.
END_OF_TEXT_SPELLINGS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
# owner/name or name, as the hub spells repositories; anything else is taken for a path.
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
# upstream's _HFTokenizer: what it adds where transformers finds no such token, in its order.
UPSTREAM_DEFAULT_SPECIALS = (
    ("pad_token", "[PAD]"),
    ("eos_token", "</s>"),
    ("bos_token", "<s>"),
    ("unk_token", "<unk>"),
)


def import_tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ValueError(
            f"--tokenizer-type {PRETRAINED_FROM_HF} needs the Hugging Face tokenizers library, "
            "which is not installed: pip install 'mds-tokenize[hf]'"
        ) from None
    return tokenizers


def _configured_token(folder: Path, key: str = "eos_token") -> tuple[str | None, Path | None]:
    """The `key` token (eos_token, pad_token, ...) a saved tokenizer's config names (a string or
    an AddedToken object), and the file that names it."""
    for name in CONFIG_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            token = json.loads(path.read_text(encoding="utf-8")).get(key)
        except (ValueError, AttributeError):
            logger.warning("%s: not a JSON object; its %s is not read", path, key)
            continue
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str) and token:
            return token, path
    return None, None


def _configured_eos(folder: Path) -> tuple[str | None, Path | None]:
    return _configured_token(folder, "eos_token")


class HFTokenizer:
    """The `Tokenizer` interface over a `tokenizers.Tokenizer`; build with `from_name_or_path`."""

    def __init__(
        self,
        backend,
        *,
        name_or_path: str,
        tokenizer_file: Path | None,
        sha256: str,
        eod_token: str | None = None,
        configured_eos: str | None = None,
        config_file: Path | None = None,
        kind: str = PRETRAINED_FROM_HF,
        configured_specials: dict[str, str] | None = None,
    ):
        self._backend = backend
        self.kind = kind
        if kind == HF_TOKENIZER:
            if eod_token is not None:
                raise ValueError(
                    f"--eod-token is for --tokenizer-type {PRETRAINED_FROM_HF}; {HF_TOKENIZER} "
                    "ends documents with the tokenizer's eos token (upstream's eod)"
                )
            configured_eos = self._add_upstream_specials(backend, configured_specials or {})
        self.name_or_path = name_or_path
        self.tokenizer_file = tokenizer_file
        self.sha256 = sha256
        vocab = backend.get_vocab(with_added_tokens=True)
        self.max_token_id = max(vocab.values())
        # Megatron's `len(tokenizer)`; ids past the count (gaps) still need a row and a dtype.
        self.vocab_size = max(backend.get_vocab_size(with_added_tokens=True), self.max_token_id + 1)
        self._has_gaps = len(set(vocab.values())) != self.max_token_id + 1
        self._eod_id, self.eod_token, eod_file = self._resolve_eod(
            eod_token, configured_eos, config_file
        )
        self._files = tuple(p for p in (tokenizer_file, eod_file) if p is not None)

    @staticmethod
    def _add_upstream_specials(backend, configured: dict[str, str]) -> str:
        """upstream's `add_special_tokens` of the defaults its config lacks; the eos token."""
        from tokenizers import AddedToken

        missing = [value for key, value in UPSTREAM_DEFAULT_SPECIALS if key not in configured]
        backend.add_special_tokens([AddedToken(token, special=True) for token in missing])
        return configured.get("eos_token", "</s>")

    @property
    def where(self) -> str:
        return str(self.tokenizer_file or self.name_or_path)

    def _resolve_eod(
        self, flag: str | None, configured: str | None, config_file: Path | None
    ) -> tuple[int | None, str | None, Path | None]:
        """--eod-token, else the configured eos token, else a usual end-of-text spelling."""
        if flag is not None:
            token_id = self._backend.token_to_id(flag)
            if token_id is None:
                raise ValueError(
                    f"--eod-token {flag!r}: not a token of {self.where}; name one of its tokens "
                    "(its end-of-text or eos token)"
                )
            return token_id, flag, None
        candidates = [(configured, config_file)] if configured is not None else []
        candidates += [(spelling, None) for spelling in END_OF_TEXT_SPELLINGS]
        for token, source in candidates:
            if (token_id := self._backend.token_to_id(token)) is not None:
                return token_id, token, source
        return None, None, None

    @classmethod
    def from_name_or_path(
        cls, name_or_path: str, *, eod_token: str | None = None, kind: str = PRETRAINED_FROM_HF
    ):
        """A folder holding tokenizer.json, the file itself, or a hub name (needs transformers);
        `kind` HFTokenizer for upstream's (`--tokenizer-model`)."""
        flag = FLAG if kind == PRETRAINED_FROM_HF else "--tokenizer-model"
        path = Path(name_or_path).expanduser()
        if path.is_dir():
            file = path / TOKENIZER_JSON
            if not file.is_file():
                held = sorted(child.name for child in path.iterdir())
                listing = ", ".join(held[:6]) + (", ..." if len(held) > 6 else "") or "nothing"
                raise ValueError(
                    f"{flag} {name_or_path}: no {TOKENIZER_JSON} in this folder (it holds "
                    f"{listing}); pass a folder holding a Hugging Face {TOKENIZER_JSON} or the "
                    "file itself (transformers writes one: AutoTokenizer.from_pretrained(NAME)"
                    ".save_pretrained(FOLDER))"
                )
            return cls.from_file(file, name_or_path=name_or_path, eod_token=eod_token, kind=kind)
        if path.is_file():
            return cls.from_file(path, name_or_path=name_or_path, eod_token=eod_token, kind=kind)
        if HUB_NAME.match(name_or_path):
            return cls.from_hub(name_or_path, eod_token=eod_token, kind=kind)
        raise ValueError(
            f"{flag} {name_or_path}: no such folder or file; pass a folder holding "
            f"{TOKENIZER_JSON}, the file itself, or a Hugging Face hub name"
        )

    @classmethod
    def from_file(
        cls,
        file: Path,
        *,
        name_or_path: str,
        eod_token: str | None = None,
        kind: str = PRETRAINED_FROM_HF,
    ):
        tokenizers = import_tokenizers()
        data = file.read_bytes()
        try:
            backend = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as error:  # tokenizers raises plain Exception for every parse error
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ValueError(
                f"{file}: not a tokenizer.json the tokenizers library can read ({reason}); "
                f"pass a Hugging Face {TOKENIZER_JSON} with {FLAG}"
            ) from None
        configured, config_file = _configured_eos(file.parent)
        specials = {
            key: _configured_token(file.parent, key)[0] for key, _ in UPSTREAM_DEFAULT_SPECIALS
        }
        return cls(
            backend,
            name_or_path=name_or_path,
            tokenizer_file=file.resolve(),
            sha256=hashlib.sha256(data).hexdigest(),
            eod_token=eod_token,
            configured_eos=configured,
            config_file=config_file,
            kind=kind,
            configured_specials={key: value for key, value in specials.items() if value},
        )

    @classmethod
    def from_hub(cls, name: str, *, eod_token: str | None = None, kind: str = PRETRAINED_FROM_HF):
        """Megatron's `AutoTokenizer.from_pretrained(name)`, keeping its fast tokenizer."""
        import_tokenizers()
        local = f"or pass a local folder holding {TOKENIZER_JSON}"
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ValueError(
                f"{FLAG} {name}: no such folder or file, and a hub name needs transformers "
                f"(pip install transformers) and the network; {local} (e.g. `hf download {name} "
                f"{TOKENIZER_JSON} --local-dir DIR`)"
            ) from None
        try:
            auto = AutoTokenizer.from_pretrained(name)
        except Exception as error:  # offline, unknown repository, no tokenizer files, ...
            reason = " ".join(str(error).split())[:160] or type(error).__name__
            raise ValueError(
                f"{FLAG} {name}: no such folder or file, and the Hugging Face hub did not provide "
                f"it ({reason}); check the name and the network, {local}"
            ) from None
        backend = getattr(auto, "backend_tokenizer", None)
        if backend is None:
            raise ValueError(
                f"{FLAG} {name}: transformers loaded a tokenizer without a tokenizers backend "
                f"(no {TOKENIZER_JSON}); save a fast tokenizer to a folder and pass that"
            )
        return cls(
            backend,
            name_or_path=name,
            tokenizer_file=None,
            sha256=hashlib.sha256(backend.to_str().encode("utf-8")).hexdigest(),
            eod_token=eod_token,
            configured_eos=auto.eos_token,
            kind=kind,
            configured_specials={
                key: getattr(auto, key)
                for key, _ in UPSTREAM_DEFAULT_SPECIALS
                if getattr(auto, key, None)
            },
        )

    @property
    def files(self) -> tuple[Path, ...]:
        return self._files

    @property
    def has_eod(self) -> bool:
        return self._eod_id is not None

    @property
    def eod(self) -> int:
        if self._eod_id is None:
            tried = ", ".join(END_OF_TEXT_SPELLINGS)
            raise ValueError(
                f"{self.where} has no end-of-text token (no eos_token in {CONFIG_FILES[0]}, none "
                f"of {tried}); name the token that ends documents with --eod-token TOKEN"
            )
        return self._eod_id

    def encode(self, text: str) -> list[int]:
        try:
            return self._backend.encode(text).ids
        except TypeError:  # a str that is not valid Unicode (lone surrogate)
            raise ValueError(
                "text contains a lone surrogate (U+D800..U+DFFF), which has no UTF-8 encoding"
            ) from None

    def encode_batch(
        self, texts: list[str], *, append_eod: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(ids as uint32 back to back, lengths as int64), as GPT2BPETokenizer.encode_batch. How
        many threads `tokenizers` uses is its TOKENIZERS_PARALLELISM (the pipeline sets false)."""
        id_lists = [encoding.ids for encoding in self._backend.encode_batch_fast(texts)]
        return pack_id_lists(id_lists, eod=self.eod if append_eod else None)

    def decode(self, ids) -> str:
        """Megatron's detokenize (`tokenizer.decode(ids)`): special tokens kept."""
        ids = ids.tolist() if isinstance(ids, np.ndarray) else [int(token) for token in ids]
        if ids and (min(ids) < 0 or max(ids) > self.max_token_id or self._has_gaps):
            bad = next(
                (
                    token
                    for token in ids
                    if not 0 <= token <= self.max_token_id
                    or self._backend.id_to_token(token) is None
                ),
                None,
            )
            if bad is not None:
                raise ValueError(
                    f"token id {bad} is not in the vocabulary (ids 0..{self.max_token_id})"
                )
        return self._backend.decode(ids, skip_special_tokens=False)

    def record(self) -> TokenizerRecord:
        return TokenizerRecord.of(
            type=self.kind,
            name_or_path=self.name_or_path,
            tokenizer_file=None if self.tokenizer_file is None else str(self.tokenizer_file),
            tokenizer_sha256=self.sha256,
            vocab_size=self.vocab_size,
            eod_id=self._eod_id,
            eod_token=self.eod_token,
            max_token_id=self.max_token_id,
        )
