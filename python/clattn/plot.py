"""python -m clattn.plot DIR: heat maps (PNG) of every weights file *.npy in DIR, (H, Tq, Tk) or
(1, H, Tq, Tk), labelled with DIR/tokens.txt (one token a line) when it is there. `clattn demo
--plot DIR` writes the tutorials' weights there and runs this."""
import glob
import os
import sys

import numpy as np


def main(argv):
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        print("usage: python -m clattn.plot DIR   (DIR holds weights .npy files, optional tokens.txt)",
              file=sys.stderr)
        return 2
    from . import plot_attention
    d = argv[1]
    tokens = None
    if os.path.exists(os.path.join(d, "tokens.txt")):
        with open(os.path.join(d, "tokens.txt")) as f:
            tokens = [t for t in f.read().split("\n") if t]
    files = sorted(glob.glob(os.path.join(d, "*.npy")))
    if not files:
        print(f"clattn.plot: no .npy files in {d}", file=sys.stderr)
        return 1
    for path in files:
        w = np.load(path)
        name = os.path.splitext(os.path.basename(path))[0]
        t = tokens if tokens is not None and len(tokens) == w.shape[-1] == w.shape[-2] else None
        plot_attention(w, tokens=t, path=os.path.join(d, name + ".png"), title=name)
        print(f"clattn.plot: {os.path.join(d, name + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
