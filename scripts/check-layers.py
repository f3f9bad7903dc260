#!/usr/bin/env python3
"""check-layers.py: the library's sources form layers, with no circle among them.

The library (src/, not src/cli/) is built in layers, bottom up (docs/ARCHITECTURE.md):

    runtime    OpenCL mechanics: errors, allocation, capabilities, programs, launches, CLBlast
    cores      the attention cores and their registry
    device     opening a device: its capabilities and its tuning file
    attention  the attention plan, its backends (ref, the OpenCL shell), the choice of a core
    decode     KV cache and decode plans          } neither uses the other
    encoder    the encoder layer                  }
    tune       clattn_tune's search (it makes plans)

A file may use (#include, or call or read a name defined in) files of its own layer or of the layers below,
never above; and no files may use each other in a circle, within a layer or across. Includes are read from
the sources; uses of names from the compiled objects (`nm`: a name one object leaves undefined and another
defines).

Above the library stand the programs (--root: the checkout), which use the library through its public header
(include/clattn.h) alone, but for the exceptions named in PROGRAMS:

    util       src/util: the .npy files and argument splitting the programs and the tests share; nothing else
    cli        src/cli: the CLI, on util (the demo's LayerNorm: encoder/encoder.h)
    bench      bench/: clattn-bench, on util
    fuzz       fuzz/: the libFuzzer harnesses, on util

and no library file uses a program's file. With --build, each program object's names that a library object defines
must be the public header's (or its exception's). Exit 0 when all of it holds, 1 with every breach listed, 2 on a
usage error.

    python3 scripts/check-layers.py --src src --objects build/CMakeFiles/clattn_objects.dir [--root . --build build]
"""
import argparse
import glob
import os
import re
import subprocess
import sys

LAYERS = [["runtime"], ["cores"], ["device"], ["attention"], ["decode", "encoder"], ["tune"]]
# the programs: their directory under the checkout, the programs whose files they may include, the library's
# internal headers they may include (beyond include/clattn.h), and their objects under the build directory
PROGRAMS = {
    "util": ("src/util", [], [], "CMakeFiles/clattn_npy.dir/src/util"),
    "cli": ("src/cli", ["util"], ["encoder/encoder.h"], "CMakeFiles/clattn_cli.dir/src/cli"),
    "bench": ("bench", ["util"], [], "CMakeFiles/clattn_bench.dir/bench"),  # and clattn_op.dir: found by path
    "fuzz": ("fuzz", ["util"], [], None),
}
GENERATED = {"clattn_build_info.h"}  # made by the build (CMake's generated/)
RANK = {name: i for i, group in enumerate(LAYERS) for name in group}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path):
    """The layer of a path relative to src/ ("runtime/blas.c" -> "runtime"), or None."""
    head = path.split("/", 1)[0]
    return head if head in RANK else None


def may_use(a, b):
    """May a file of layer a use one of layer b?"""
    la, lb = layer_of(a), layer_of(b)
    if la == lb:
        return True
    return RANK[lb] < RANK[la]


def sources(src):
    out = []
    for root, _, files in os.walk(src):
        for f in files:
            if f.endswith((".c", ".h")):
                rel = os.path.relpath(os.path.join(root, f), src)
                if layer_of(rel):
                    out.append(rel)
    return sorted(out)


def include_edges(src, files):
    """(file, included file, '#include') for includes that resolve to a library source."""
    known = set(files)
    edges = []
    for f in files:
        with open(os.path.join(src, f), encoding="utf-8") as fh:
            text = fh.read()
        for name in INCLUDE.findall(text):
            for cand in (os.path.normpath(os.path.join(os.path.dirname(f), name)), os.path.normpath(name)):
                if cand in known:
                    edges.append((f, cand, "#include"))
                    break
    return edges


def symbol_edges(objdir, files):
    """(file, file, names) for names one object uses and another defines."""
    objects = {}
    for f in files:
        if f.endswith(".c"):
            obj = os.path.join(objdir, "src", f + ".o")
            if not os.path.exists(obj):
                sys.exit(f"check-layers: no object {obj} (build first)")
            objects[f] = obj
    defined, undefined = {}, {}
    for f, obj in objects.items():
        out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True).stdout
        undefined[f] = set()
        for line in out.splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            sym, kind = parts[0], parts[1]
            if kind == "U":
                undefined[f].add(sym)
            elif kind in "TDBRCVW":
                defined.setdefault(sym, f)
    edges = {}
    for f, syms in undefined.items():
        for s in syms:
            g = defined.get(s)
            if g and g != f:
                edges.setdefault((f, g), []).append(s)
    return [(a, b, ", ".join(sorted(names))) for (a, b), names in sorted(edges.items())]


def program_files(root):
    """{program: [paths relative to root]} of the programs' C sources and headers."""
    out = {}
    for name, (d, _, _, _) in PROGRAMS.items():
        full = os.path.join(root, d)
        out[name] = sorted(os.path.join(d, f) for f in os.listdir(full) if f.endswith((".c", ".h"))) \
            if os.path.isdir(full) else []
    return out


def check_programs(root, src, lib_files, build):
    """Breaches of the programs' rules, as lines."""
    progs = program_files(root)
    owner = {os.path.basename(f): name for name, fs in progs.items() for f in fs}
    lib = set(lib_files)
    out = []
    for name, files in progs.items():
        _, may, exceptions, _ = PROGRAMS[name]
        for f in files:
            with open(os.path.join(root, f), encoding="utf-8") as fh:
                text = fh.read()
            for inc in INCLUDE.findall(text):
                base = os.path.basename(inc)
                if inc == "clattn.h" or inc in GENERATED or inc in exceptions:
                    continue
                if base in owner and owner[base] == name:
                    continue
                if base in owner and owner[base] in may:
                    continue
                if os.path.normpath(inc) in lib:
                    out.append(f"{f} ({name}) includes the library's internal {inc}: programs use include/clattn.h")
                elif base in owner:
                    out.append(f"{f} ({name}) includes {inc} of {owner[base]}, which {name} may not use")
    for f in lib_files:
        with open(os.path.join(src, f), encoding="utf-8") as fh:
            text = fh.read()
        for inc in INCLUDE.findall(text):
            base = os.path.basename(inc)
            if base in owner and os.path.normpath(os.path.join(os.path.dirname(f), inc)) not in lib and \
                    os.path.normpath(inc) not in lib:
                out.append(f"src/{f} (library) includes {inc} of the program {owner[base]}")
    if build:
        public = set(re.findall(r"\b(clattn_[a-z0-9_]+)\s*\(", open(os.path.join(root, "include", "clattn.h")).read()))
        defined = {}
        for f in lib_files:
            if f.endswith(".c"):
                obj = os.path.join(build, "CMakeFiles", "clattn_objects.dir", "src", f + ".o")
                if os.path.exists(obj):
                    for line in subprocess.run(["nm", "-P", obj], capture_output=True, text=True,
                                               check=True).stdout.splitlines():
                        parts = line.split()
                        if len(parts) >= 2 and parts[1] in "TDBRCVW":
                            defined[parts[0]] = f
        for name, files in progs.items():
            _, _, exceptions, objdir = PROGRAMS[name]
            if not objdir:
                continue
            allowed = set(public)
            for h in exceptions:
                allowed |= set(re.findall(r"\b(clattn_[a-z0-9_]+)\s*\(", open(os.path.join(src, h)).read()))
            for f in files:
                if not f.endswith(".c"):
                    continue
                found = sorted(glob.glob(os.path.join(build, "CMakeFiles", "*.dir", f + ".o")))
                obj = found[0] if found else os.path.join(build, objdir, os.path.basename(f) + ".o")
                if not os.path.exists(obj):
                    out.append(f"{f} ({name}): no object {obj} (build first)")
                    continue
                for line in subprocess.run(["nm", "-P", obj], capture_output=True, text=True,
                                           check=True).stdout.splitlines():
                    parts = line.split()
                    if len(parts) >= 2 and parts[1] == "U" and parts[0] in defined and parts[0] not in allowed:
                        out.append(f"{f} ({name}) uses {parts[0]} of src/{defined[parts[0]]}, not in the public header")
    return out


def circles(files, edges):
    """Strongly connected components of more than one file (Tarjan)."""
    graph = {f: set() for f in files}
    for a, b, _ in edges:
        if a != b:
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True, help="the library's source directory (src)")
    ap.add_argument("--objects", required=True, help="the object library's build directory (CMakeFiles/clattn_objects.dir)")
    ap.add_argument("--root", help="the checkout: check the programs above the library too (PROGRAMS)")
    ap.add_argument("--build", help="with --root: the build directory, whose program objects are checked too")
    args = ap.parse_args()
    if not os.path.isdir(args.src) or not os.path.isdir(args.objects):
        print("check-layers: --src and --objects must be directories", file=sys.stderr)
        return 2
    files = sources(args.src)
    uses = include_edges(args.src, files) + symbol_edges(args.objects, files)
    bad = 0
    for a, b, what in uses:
        if not may_use(a, b):
            print(f"check-layers: {a} ({layer_of(a)}) uses {b} ({layer_of(b)}), a layer above it: {what}")
            bad += 1
    for comp in circles(files, uses):
        ties = [f"{a} -> {b}: {what}" for a, b, what in uses if a in comp and b in comp and a != b]
        print("check-layers: these files use each other in a circle: " + ", ".join(comp))
        for t in ties:
            print("  " + t)
        bad += 1
    nprog = 0
    if args.root:
        for line in check_programs(args.root, args.src, files, args.build):
            print("check-layers: " + line)
            bad += 1
        nprog = sum(len(v) for v in program_files(args.root).values())
    n_layers = len({layer_of(f) for f in files})
    if bad:
        print(f"check-layers: {bad} breach(es) in {len(files)} files", file=sys.stderr)
        return 1
    print(f"check-layers: {len(files)} files in {n_layers} layers, {len(uses)} uses, all downward, no circle"
          + (f"; {nprog} files of the programs ({', '.join(PROGRAMS)}) on the public header" if args.root else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
