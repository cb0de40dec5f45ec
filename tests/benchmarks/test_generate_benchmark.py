"""benchmarks/generate.py's smoke run (--tiny, CPU): GPT-2 and the Llama (grouped-query attention,
untied head) each exported to transformers by their family's adapter, timed against its `generate`
at two batch sizes, every greedy token equal to transformers', the bandwidth bound's fraction
printed; an unknown model is a usage error."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks/generate.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )


def test_tiny_gpt2_and_llama_agree_with_transformers_and_print_the_bound():
    result = run("--device", "cpu", "--tiny", "--models", "gpt2,llama", "--threads", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert any(
        line.startswith("llama: 2 layers, hidden 64, 4 heads, 2 key/value heads, ffn 176, ")
        for line in lines
    ), result.stdout
    rows = [line for line in lines if re.match(r"\s*(gpt2|llama) \|\s+\d+ \|", line)]
    seen = {(cells[0].strip(), int(cells[1])) for cells in (row.split("|") for row in rows)}
    assert seen == {(m, b) for m in ("gpt2", "llama") for b in (1, 2)}, result.stdout
    for row in rows:
        cells = [cell.strip() for cell in row.split("|")]
        batch = int(cells[1])
        assert re.fullmatch(r"\d+\.\d%", cells[6]), row  # the fraction of the bound
        assert cells[9].startswith(f"{[8] * batch} of 8 "), row  # every greedy token agrees


def test_an_unknown_model_is_a_usage_error():
    result = run("--device", "cpu", "--models", "gpt2,mistral")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].endswith(
        "--models: unknown mistral; choose from gpt2, llama"
    )
