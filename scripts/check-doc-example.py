#!/usr/bin/env python3
"""check-doc-example.py: docs/ARCHITECTURE.md's worked example of a core is a real file, quoted whole.

The first ```c block under "## Adding a core: a worked example" must be the end of src/cores/flash_rows.c,
letter for letter, from the block's first line on (the descriptor a new core is written after). Exit 0 when it
is, 1 naming the first line that differs, 2 on a usage error.

    python3 scripts/check-doc-example.py [--root DIR]
"""
import argparse
import os
import re
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    doc_path = os.path.join(args.root, "docs", "ARCHITECTURE.md")
    src_path = os.path.join(args.root, "src", "cores", "flash_rows.c")
    try:
        doc = open(doc_path, encoding="utf-8").read()
        src = open(src_path, encoding="utf-8").read()
    except OSError as e:
        print(f"check-doc-example: {e}", file=sys.stderr)
        return 2
    at = doc.find("## Adding a core: a worked example")
    m = re.search(r"```c\n(.*?)```", doc[at:], re.S) if at >= 0 else None
    if not m:
        print("check-doc-example: no ```c block under '## Adding a core: a worked example' in docs/ARCHITECTURE.md")
        return 1
    quote = m.group(1).rstrip("\n").split("\n")
    lines = src.rstrip("\n").split("\n")
    try:
        start = lines.index(quote[0])
    except ValueError:
        print(f"check-doc-example: the quote's first line is not in src/cores/flash_rows.c: {quote[0]!r}")
        return 1
    tail = lines[start:]
    for i, (q, l) in enumerate(zip(quote, tail)):
        if q != l:
            print(f"check-doc-example: quote line {i + 1} differs from src/cores/flash_rows.c line {start + i + 1}:\n"
                  f"  doc:  {q!r}\n  file: {l!r}")
            return 1
    if len(quote) != len(tail):
        print(f"check-doc-example: the quote has {len(quote)} lines, the file from there {len(tail)}: quote it whole")
        return 1
    print(f"check-doc-example: the worked example is src/cores/flash_rows.c from line {start + 1}, whole")
    return 0


if __name__ == "__main__":
    sys.exit(main())
