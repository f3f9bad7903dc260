#!/usr/bin/env python3
"""scripts/mutants-narrow.py: narrow each mutant of scripts/mutants.txt to the test that caught it.

Reads a scripts/mutate.sh log (its "ID caught by ENTRY, N failing: suite::name ..." lines) and gives every mutant
caught by one Criterion binary's ctest entry, with at least one failing test named and no pattern yet, the pattern
" % suite/name" of its first failing test: mutate.sh then runs that test alone (CRITERION_TEST_PATTERN) instead of
the whole binary up to it. A mutant caught by a Python entry with pytest's first failure named (mutate.sh's
"pytest::test_name") gets " % pytest:test_name" (pytest -k). Mutants caught otherwise (scripts, a crash or a hang
before a test is named) keep their regex alone. A narrowed mutant that a later change lets through shows as SURVIVED
naming its pattern: run mutate.sh --only ID, and drop or change the pattern if another test now catches it.

  python3 scripts/mutants-narrow.py LOG [--list scripts/mutants.txt] [--dry-run]
"""
import argparse
import re
import sys

CAUGHT = re.compile(r"^(\S+)\s+caught by (\S+), (\d+) failing: (.*?) \(\d+ s\)$")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--list", default="scripts/mutants.txt")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    first = {}
    with open(a.log, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = CAUGHT.match(line.rstrip("\n"))
            if not m:
                continue
            mid, entry, nfail, fails = m.groups()
            names = re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)::([A-Za-z_][A-Za-z0-9_]*)\b", fails)
            if "," in entry or not entry.startswith("test_") or not names:
                continue
            if entry.startswith("test_python"):  # mutate.sh names pytest's first failure pytest::test_name
                if names[0][0] == "pytest":
                    first[mid] = "pytest:" + names[0][1]
                continue
            first[mid] = "%s/%s" % names[0]
    out, narrowed = [], 0
    with open(a.list, encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split(" @@ ")
            if len(fields) == 5 and not line.startswith("#") and fields[0] in first and " % " not in fields[4]:
                fields[4] += " % " + first[fields[0]]
                line = " @@ ".join(fields) + "\n"
                narrowed += 1
            out.append(line)
    if not a.dry_run:
        with open(a.list, "w", encoding="utf-8") as f:
            f.writelines(out)
    print("mutants-narrow: %d of %d caught mutants narrowed to their test" % (narrowed, len(first)), file=sys.stderr)


if __name__ == "__main__":
    main()
