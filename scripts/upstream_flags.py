"""The table of upstream's example flags (packages/train/docs/upstream-flags.md): what mds-train
does with each flag that Megatron-DeepSpeed's `examples_deepspeed/**/*.sh` scripts pass.

    python scripts/upstream_flags.py UPSTREAM_TREE [--readme FILE] [--check]

UPSTREAM_TREE is a checkout of deepspeedai/Megatron-DeepSpeed. `pretrain_gpt.py`'s flags are the
`add_argument` calls of its `megatron/arguments.py` plus DeepSpeed's `add_config_arguments`
(read from the installed deepspeed); every `--flag` on an uncommented line of a script that is one
of them is a row, classified by mds-train's own tables (`mds_train.megatron_flags.classify`):
works, ignored (with its note), refused (with its reason), or unknown (new upstream: printed, and
exit 1 with --check). Flags of the scripts' other commands (the launchers, tools, nvidia-smi) get a
second table naming which program declares them. The tables replace what lies between the
markers in that file.
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib.util
import re
import sys
from pathlib import Path

BEGIN = "<!-- upstream-flags:begin (scripts/upstream_flags.py) -->"
END = "<!-- upstream-flags:end -->"
DOC = Path("packages/train/docs/upstream-flags.md")
FLAG = re.compile(r"(?<![\w-])(--[A-Za-z][\w-]*)")


def declared_options(path: Path) -> set[str]:
    """Every option string of the `add_argument` calls in one Python file."""
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            names.update(
                arg.value
                for arg in node.args
                if isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
                and arg.value.startswith("--")
            )
    return names


def _installed_file(module: str, relative: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path if path.is_file() else None


def script_flags(tree: Path) -> dict[str, set[str]]:
    """flag -> the example scripts that pass it (relative paths), comments skipped."""
    users = collections.defaultdict(set)
    for script in sorted(tree.glob("examples_deepspeed/**/*.sh")):
        for line in script.read_text(errors="replace").splitlines():
            if line.lstrip().startswith("#"):
                continue
            for flag in FLAG.findall(line.split(" #")[0]):
                users[flag].add(str(script.relative_to(tree)))
    return users


def other_owners(tree: Path) -> dict[str, list[str]]:
    """flag -> the programs besides pretrain_gpt.py that declare it: upstream's own scripts and
    tools, DeepSpeed's launcher, torchrun."""
    owners = collections.defaultdict(list)
    for path in sorted(tree.rglob("*.py")):
        if path.relative_to(tree).as_posix() == "megatron/arguments.py":
            continue
        for name in declared_options(path):
            owners[name].append(path.relative_to(tree).as_posix())
    for module, relative, label in (
        ("deepspeed", "launcher/runner.py", "the deepspeed launcher"),
        ("torch", "distributed/run.py", "torchrun"),
    ):
        path = _installed_file(module, relative)
        for name in declared_options(path) if path else ():
            owners[name].insert(0, label)
    return owners


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def tables(tree: Path) -> tuple[str, list[str]]:
    """The markdown between the markers, and the flags mds-train does not classify."""
    from mds_train.megatron_flags import classify

    pretrain = declared_options(tree / "megatron/arguments.py")
    deepspeed_init = _installed_file("deepspeed", "__init__.py")
    pretrain |= declared_options(deepspeed_init) if deepspeed_init else set()
    users = script_flags(tree)
    ours = sorted((f for f in users if f in pretrain), key=lambda f: (-len(users[f]), f))
    theirs = sorted((f for f in users if f not in pretrain), key=lambda f: (-len(users[f]), f))
    counts = collections.Counter()
    unknown = []
    lines = [
        f"{len(ours)} flags of `pretrain_gpt.py`'s parser (`megatron/arguments.py` and "
        "DeepSpeed's) appear in upstream's example scripts; `scripts` counts the scripts "
        "passing each.",
        "",
        "| flag | scripts | mds-train | what it does |",
        "|---|---|---|---|",
    ]
    for flag in ours:
        status, detail = classify(flag)
        counts[status] += 1
        if status == "unknown":
            unknown.append(flag)
        lines.append(f"| `{flag}` | {len(users[flag])} | {status} | {_cell(detail)} |")
    summary = ", ".join(f"{counts[s]} {s}" for s in ("works", "ignored", "refused", "unknown"))
    lines += ["", f"In all: {summary}.", ""]
    owners = other_owners(tree)
    lines += [
        f"{len(theirs)} flags in the scripts belong to other commands (launchers, upstream's "
        "tools, shell programs); mds-train does not take them:",
        "",
        "| flag | scripts | declared by |",
        "|---|---|---|",
    ]
    for flag in theirs:
        where = ", ".join(f"`{o}`" if "/" in o else o for o in owners.get(flag, [])[:3])
        lines.append(f"| `{flag}` | {len(users[flag])} | {where or 'a non-Python program'} |")
    return "\n".join(lines), unknown


def replace_between_markers(text: str, body: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + body + "\n" + text[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("upstream", type=Path, help="a Megatron-DeepSpeed checkout")
    parser.add_argument("--readme", type=Path, default=DOC, help="the file with the markers")
    parser.add_argument("--check", action="store_true", help="exit 1 if a flag is unknown")
    args = parser.parse_args()
    body, unknown = tables(args.upstream)
    text = args.readme.read_text()
    args.readme.write_text(replace_between_markers(text, body))
    for flag in unknown:
        print(f"unknown to mds-train: {flag}", file=sys.stderr)
    return 1 if unknown and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
