#!/usr/bin/env python3
"""check-kernels.py: rules every kernel in cl/ keeps, for drivers with defects the device probes find (issue 45).

  no `0 * x` to carry a NaN: Mesa 22's rusticl folds 0.0f * x to 0 even when x is NaN or Inf (IEEE says NaN).
  A kernel that wants "0, or NaN when x is" writes a select: isnan(x) ? NAN : 0.0f.

Exit 1 with each offending line named."""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
ZERO = r"(?:\(\s*)?(?:\(float\)\s*)?(?:0\.0*f?|0f)(?:\s*\))?"
PATTERN = re.compile(r"(?<![\w.])" + ZERO + r"\s*\*(?!\s*\d)|\*\s*" + ZERO + r"(?![\w.])")

bad = []
for path in sorted((ROOT / "cl").rglob("*.cl")):
    if path.name == "probe_device.cl":  # the probe multiplies by 0 on purpose: it looks for the defect
        continue
    for n, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("//")[0]
        if "/*" in code and "*/" in code:
            code = re.sub(r"/\*.*?\*/", "", code)
        if code.lstrip().startswith("*") or code.lstrip().startswith("/*"):
            continue
        if PATTERN.search(code):
            bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
if bad:
    print("check-kernels: a product with a literal 0 (a driver may fold it to 0 when the other factor is NaN; "
          "write a select):")
    print("\n".join(bad))
    sys.exit(1)
print(f"check-kernels: no kernel multiplies by a literal 0")
