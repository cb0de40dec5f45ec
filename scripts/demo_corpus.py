"""Writes the demo's embedded corpus: Python's own help topics (`pydoc_data.topics`), one jsonl
document per topic in sorted order, so the demo needs no download and is the same on every machine
with the same Python."""

import argparse
import json
from pathlib import Path
from pydoc_data.topics import topics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, required=True, help="jsonl file to write")
    args = parser.parse_args()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    temp = args.output.with_name(args.output.name + ".tmp")
    with open(temp, "w", encoding="utf-8") as out:
        for name in sorted(topics):
            out.write(json.dumps({"text": topics[name], "topic": name}, ensure_ascii=False) + "\n")
    temp.replace(args.output)
    print(f"wrote {len(topics)} documents to {args.output}")


if __name__ == "__main__":
    main()
