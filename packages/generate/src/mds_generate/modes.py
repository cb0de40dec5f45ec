"""The four ways to sample: one `--prompt`, every line of `--sample-input-file`, unconditional
`--num-samples N --genfile F`, and an interactive loop on stdin; the latter two print as tokens
arrive.

Unlike Megatron's `generate_samples_gpt.py`, every line of the prompt file is a prompt (the last
one too, and one containing "stop" is just a prompt), and outputs are JSON lines written
atomically with the resolved configuration beside them.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import TextIO

from mds_common.files import AtomicFile
from mds_common.sidecar import write_sidecar
from mds_tokenize.interface import Tokenizer

from .config import SampleConfig, as_dict
from .engine import Completion, Generator
from .loading import LoadedModel, load
from .sampling import Sampler
from .tokenizer import TextStream

logger = logging.getLogger(__name__)
DISTRIBUTION = "mds-generate"


class StreamPrinter:
    """Prints one row's text as its tokens arrive (the engine's `on_step`), holding back text
    that may be the start of a stop string; `finish` prints the rest of the final completion."""

    def __init__(self, tokenizer: Tokenizer, config: SampleConfig, out: TextIO) -> None:
        self.stream, self.out, self.eod = TextStream(tokenizer), out, tokenizer.eod
        self.stops, self.stop_at_eod = config.generation.stop, config.generation.stop_at_eod
        self.text, self.printed, self.ended = "", 0, False

    def __call__(self, tokens: list[int]) -> None:
        if self.ended:
            return
        if self.stop_at_eod and tokens[0] == self.eod:
            self.ended = True
            return
        self.text += self.stream.push(tokens[0])
        safe = len(self.text)
        found = [self.text.find(stop) for stop in self.stops if stop in self.text]
        if found:
            safe, self.ended = min(found), True
        else:
            for stop in self.stops:  # the longest tail that a stop string could begin with
                for size in range(min(len(stop) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(stop[:size]):
                        safe = min(safe, len(self.text) - size)
                        break
        self._write(self.text[self.printed : safe])
        self.printed = max(self.printed, safe)

    def finish(self, completion: Completion) -> None:
        self._write(completion.text[self.printed :] + "\n")

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()


def encode_prompt(tokenizer: Tokenizer, text: str, *, where: str, context: int) -> list[int]:
    """The prompt's ids (end-of-document alone for an empty line); ValueError when it fills the
    context."""
    ids = tokenizer.encode(text) if text else [tokenizer.eod]
    if len(ids) >= context:
        raise ValueError(
            f"{where}: the prompt has {len(ids)} tokens but the context holds {context}, new "
            "tokens included; shorten it"
        )
    return ids


def read_prompt_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text (byte {error.start})") from None
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise ValueError(f"{path}: empty prompt file; write one prompt per line")
    return lines


def _sidecar(config: SampleConfig, loaded: LoadedModel, output: Path, **fields) -> None:
    inputs = [*loaded.inputs]
    if config.sample_input_file is not None:
        inputs.append(config.sample_input_file)
    write_sidecar(
        Path(f"{output}.generate.json"),
        tool="mds-generate",
        distribution=DISTRIBUTION,
        inputs=inputs,
        config=as_dict(config),
        **fields,
    )


def _write_lines(path: Path, records) -> int:
    """JSON lines into a temporary file, renamed into place when complete."""
    count = 0
    with AtomicFile(path, "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count


def run_input_file(config: SampleConfig, loaded: LoadedModel, generator: Generator) -> None:
    path, output = config.sample_input_file, config.output_file
    lines = read_prompt_lines(path)
    context = generator.context_length(config.generation)
    prompts = [
        encode_prompt(loaded.tokenizer, line, where=f"{path}:{number}", context=context)
        for number, line in enumerate(lines, start=1)
    ]
    sampler = Sampler(config.sampling, vocab_size=generator.vocab_size, device=loaded.device)
    start, batch = time.perf_counter(), config.micro_batch_size

    def records():
        num_tokens = 0
        for first in range(0, len(prompts), batch):
            done = generator.generate(
                prompts[first : first + batch], sampler=sampler, generation=config.generation
            )
            for line, completion in zip(lines[first : first + batch], done, strict=True):
                num_tokens += len(completion.token_ids)
                yield {
                    "prompt": line,
                    "completion": completion.text,
                    "token_ids": list(completion.token_ids),
                    "finish_reason": completion.finish_reason,
                }
            seconds = time.perf_counter() - start
            logger.info(
                "prompts %d/%d | %.1f new tokens/s",
                min(first + batch, len(prompts)),
                len(prompts),
                num_tokens / seconds,
            )

    count = _write_lines(output, records())
    _sidecar(config, loaded, output, num_prompts=count, seconds=time.perf_counter() - start)
    logger.info("wrote %d completions to %s", count, output)


def run_unconditional(config: SampleConfig, loaded: LoadedModel, generator: Generator) -> None:
    """Megatron's unconditional samples: each starts from end-of-document alone; one JSON line
    `{"text", "length", "finished"}` per sample ("length" counts the tokens generated, the final
    end-of-document included; "finished": it ended with end-of-document)."""
    eod, start = loaded.tokenizer.eod, time.perf_counter()
    sampler = Sampler(config.sampling, vocab_size=generator.vocab_size, device=loaded.device)

    def records():
        made, batches, interval_start = 0, 0, time.perf_counter()
        while made < config.num_samples:
            rows = min(config.micro_batch_size, config.num_samples - made)
            done = generator.generate([[eod]] * rows, sampler=sampler, generation=config.generation)
            batches += 1
            if batches % config.log_interval == 0:
                elapsed = time.perf_counter() - interval_start
                logger.info("Avg s/batch: %.3f", elapsed / config.log_interval)
                interval_start = time.perf_counter()
            for completion in done:
                finished = completion.finish_reason == "eod"
                yield {
                    "text": completion.text,
                    "length": len(completion.token_ids) + int(finished),
                    "finished": finished,
                }
            made += rows

    count = _write_lines(config.genfile, records())
    _sidecar(config, loaded, config.genfile, num_samples=count, seconds=time.perf_counter() - start)
    logger.info("wrote %d samples to %s", count, config.genfile)


def _stream_one(
    text: str, config: SampleConfig, loaded: LoadedModel, generator: Generator, sampler, *, where
) -> None:
    context = generator.context_length(config.generation)
    prompt = encode_prompt(loaded.tokenizer, text, where=where, context=context)
    printer = StreamPrinter(loaded.tokenizer, config, sys.stdout)
    (completion,) = generator.generate(
        [prompt], sampler=sampler, generation=config.generation, on_step=printer
    )
    printer.finish(completion)


def run_prompt(config: SampleConfig, loaded: LoadedModel, generator: Generator) -> None:
    if not config.prompt:
        raise ValueError("--prompt is empty; give some text (or use --num-samples for none)")
    sampler = Sampler(config.sampling, vocab_size=generator.vocab_size, device=loaded.device)
    _stream_one(config.prompt, config, loaded, generator, sampler, where="--prompt")


def run_interactive(config: SampleConfig, loaded: LoadedModel, generator: Generator) -> None:
    """One prompt per line of stdin (a terminal or a pipe), each completion streamed to stdout;
    ends at end of input (Ctrl-D)."""
    sampler = Sampler(config.sampling, vocab_size=generator.vocab_size, device=loaded.device)
    terminal = sys.stdin.isatty()
    number = 0
    while True:
        if terminal:
            sys.stderr.write("prompt> ")
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:
            break
        number += 1
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        try:
            _stream_one(line, config, loaded, generator, sampler, where=f"stdin:{number}")
        except ValueError as error:
            if not terminal:
                raise
            sys.stderr.write(f"{error}\n")  # at a terminal, say so and take the next prompt


def run_sample(config: SampleConfig) -> None:
    loaded = load(config.source)
    generator = Generator(
        loaded.model,
        loaded.tokenizer,
        device=loaded.device,
        cuda_graphs=config.source.cuda_graphs,
        vocab_size=loaded.num_ids,
    )
    runners = {
        "prompt": run_prompt,
        "input-file": run_input_file,
        "unconditional": run_unconditional,
        "interactive": run_interactive,
    }
    runners[config.mode](config, loaded, generator)
