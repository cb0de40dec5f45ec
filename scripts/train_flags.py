"""mds-train's flag reference: every option `mds-train --help` lists, with its meaning and default,
grouped by the config section that declares it (`mds_train.config.SECTIONS`).

    python scripts/train_flags.py [--doc packages/train/docs/flags.md] [--check]

The rows are read from the config sections' `flag(help=...)` fields, which typer turns into the
command's options, so they are what `--help` prints. The table replaces what lies between
the markers in the doc; `--check` writes nothing and exits 1 when the doc differs from the code
(tests/train/test_flag_reference.py runs the same comparison).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BEGIN = "<!-- train-flags:begin (scripts/train_flags.py) -->"
END = "<!-- train-flags:end -->"
DOC = Path(__file__).resolve().parents[1] / "packages/train/docs/flags.md"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(field, spec) -> str:
    """The default as `--help` shows it (mds_common.flags.typer_parameters' rule)."""
    if spec.required:
        return "required"
    if spec.shown_default is not None:
        return spec.shown_default
    value = (not field.default) if spec.negates else field.default
    if spec.is_flag:
        return "on" if value else ""
    if value is None or value == ():
        return ""
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


def _names(spec) -> str:
    spelled = " ".join(f"`{n}`" for n in spec.names)
    if spec.choices:
        spelled += " {" + ",".join(spec.choices) + "}"
    elif spec.nargs > 1:
        spelled += f" ({spec.nargs} values)"
    elif spec.multiple:
        spelled += " (one or more)"
    return spelled


def rows() -> list[tuple[str, str, str, str]]:
    """(section, flag, default, meaning) for every flag of mds-train's config sections, in
    `--help`'s order."""
    from mds_common.flags import flag_fields
    from mds_train.config import SECTIONS

    table = []
    for section, group in SECTIONS.items():
        for field, spec in flag_fields(group):
            if spec.names:
                table.append((section, _names(spec), _default(field, spec), spec.help))
    return table


def table() -> str:
    lines = [
        "Generated from the `flag(help=...)` strings by `python scripts/train_flags.py`; "
        "`tests/train/test_flag_reference.py` fails when it differs from `mds-train --help`.",
        "",
        "| section | flag | default | meaning |",
        "|---|---|---|---|",
    ]
    for section, names, default, meaning in rows():
        shown = f"`{_cell(default)}`" if default else ""
        lines.append(f"| {section} | {names} | {shown} | {_cell(meaning)} |")
    return "\n".join(lines)


def replace_between_markers(text: str, body: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + body + "\n" + text[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--check", action="store_true", help="exit 1 if the doc is stale")
    args = parser.parse_args()
    text = args.doc.read_text()
    new = replace_between_markers(text, table())
    if args.check:
        if new != text:
            print(f"{args.doc}: stale; run python scripts/train_flags.py", file=sys.stderr)
            return 1
        return 0
    args.doc.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
