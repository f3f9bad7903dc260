#!/usr/bin/env bash
# scripts/gpu-static.sh: the GPU cores' machine code on an H100, read without a GPU. For each GPU core at its
# defaults (and the decode and GEMV kernels), `clattn emit --target sm_90` writes the exact program and options a
# plan would build on an H100 (NVIDIA's OpenCL's capabilities simulated on the host device), then
# ../shared/gpu/ptx-check.sh --sass compiles it for sm_90 (clang + libclc -> PTX -> ptxas), disassembles it and
# counts each loop's instructions (sass_mix.py). One table: registers, spills, the hot loop's mix, its bound and
# ceiling on an H100 SXM (useful TFLOP/s: 3xTF32 issues three mma per product, so a third of the tensor work
# counts), and for the memory-bound loops the bytes loaded per iteration against its issue cycles.
#
#   bash scripts/gpu-static.sh [--build DIR] [--out FILE.md]     (default build/, table on stdout)
#
# The clang/libclc path is not NVIDIA's OpenCL compiler: registers and instruction counts are indicative, the
# ceilings are upper bounds (no latency, bank conflicts or occupancy), made to compare two versions of a kernel.
# Needs: a built clattn with an OpenCL device (PoCL), ptxas (CUDA toolkit), libclc's nvptx library and the clang
# of the same LLVM version (Debian 12: libclc-15 with clang-15, which mesa-opencl-icd pulls in), and nvdisasm
# (ptx-check.sh installs it from PyPI on first use).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
out=
while [ $# -gt 0 ]; do
    case $1 in
        --build) build=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "gpu-static.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
check=${PTX_CHECK:-$root/../shared/gpu/ptx-check.sh}
[ -x "$build/clattn" ] || { echo "gpu-static.sh: no clattn in $build (build first, or --build DIR)" >&2; exit 2; }
[ -f "$check" ] || { echo "gpu-static.sh: $check not found (PTX_CHECK=path/to/ptx-check.sh)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# clang must be of libclc's LLVM version (its bitcode is read by clang); clang 15 needs -fgnu-keywords for asm()
# in OpenCL C. A wrapper named clang, first on PATH for ptx-check.sh.
clc_llvm=$(dpkg-query -W -f='${Version}' 'libclc-*' 2>/dev/null | sed -n 's/^1:\([0-9]*\)\..*/\1/p' | head -1)
cc=$(command -v "clang-${clc_llvm:-14}" || command -v clang)
mkdir -p "$tmp/bin"
printf '#!/bin/sh\nexec "%s" -fgnu-keywords "$@"\n' "$cc" > "$tmp/bin/clang"
chmod +x "$tmp/bin/clang"

# case: name | kernel | program (its STEM) | clattn emit arguments | mma products per useful one (0: a memory loop) |
#       passes of each loop nested in the hot loop, in address order (their work folded into the figures; a count
#       that does not match the loops found fails the case)
bwd="--training --core flash_backward_gemm --no-weights --seq 4096"
cases=(
    "flash_mma 3xTF32 d=64|flash_mma|flash_mma|--core flash_mma --no-weights --heads 16 --head-dim-qk 64 --seq 4096|3|"
    "flash_mma 3xTF32 d=128|flash_mma|flash_mma|--core flash_mma --no-weights --heads 8 --head-dim-qk 128 --seq 4096|3|"
    "flash_mma f16 d=64|flash_mma|flash_mma|--core flash_mma --no-weights --dtype f16 --heads 16 --head-dim-qk 64 --seq 4096|1|"
    "flash_mma bf16 d=64|flash_mma|flash_mma|--core flash_mma --no-weights --dtype bf16 --heads 16 --head-dim-qk 64 --seq 4096|1|"
    "flash_mma f16 d=128|flash_mma|flash_mma|--core flash_mma --no-weights --dtype f16 --heads 8 --head-dim-qk 128 --seq 4096|1|2,2"
    "flash_mma TF32 d=64|flash_mma|flash_mma|--core flash_mma --no-weights --tf32 --heads 16 --head-dim-qk 64 --seq 4096|1|"
    "flash_mma TF32 d=128|flash_mma|flash_mma|--core flash_mma --no-weights --tf32 --heads 8 --head-dim-qk 128 --seq 4096|1|"
    "flash_gemm d=64|flash_gemm|flash_gemm|--core flash_gemm --no-weights --heads 16 --head-dim-qk 64 --seq 4096|1|"
    "flash_gemm d=128|flash_gemm|flash_gemm|--core flash_gemm --no-weights --heads 8 --head-dim-qk 128 --seq 4096|1|"
    "flash_backward_gemm dQ d=64|bwd_dq_tiles|flash_backward_gemm|$bwd --heads 16 --head-dim-qk 64|1|2,2"
    "flash_backward_gemm dK/dV d=64|bwd_dkdv_tiles|flash_backward_gemm|$bwd --heads 16 --head-dim-qk 64|1|2,2"
    "flash_backward_gemm dQ d=128|bwd_dq_tiles|flash_backward_gemm|$bwd --heads 8 --head-dim-qk 128|1|4,4"
    "flash_backward_gemm dK/dV d=128|bwd_dkdv_tiles|flash_backward_gemm|$bwd --heads 8 --head-dim-qk 128|1|4,4"
    "decode_group d=128 GQA 4|decode_group|decode_group|--core decode_group --decode --heads 32 --kv-heads 8 --head-dim-qk 128 --seq 32768|0|"
    "decode_group d=64|decode_group|decode_group|--core decode_group --decode --heads 16 --head-dim-qk 64 --seq 32768|0|"
    "linear_gemv E=4096|linear_gemv|linear|--decode --heads 32 --kv-heads 8 --head-dim-qk 128 --seq 4096|0|"
)

{
echo "# GPU cores on sm_90, read without a GPU ($(date -u +%F), git $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown))"
echo
echo "scripts/gpu-static.sh: clattn emit --target sm_90 (defaults an H100 gets), clang $("$cc" --version | sed -n 's/.*version \([0-9.]*\).*/\1/p' | head -1) + libclc + ptxas $(ptxas --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p'), sass_mix.py."
echo "Ceilings assume every SM runs the hot loop alone at 1.755 GHz (132 SMs): upper bounds for comparing versions."
echo "The hot loop is the kernel's loop of the most instructions; a loop nested in it (kept a loop where unrolling it"
echo "whole spilled) is folded into its figures with the passes the kernel makes of it per tile, named in the row."
echo
echo "| case | parameters | registers | spills | hot loop: instructions per iteration | bound | ceiling |"
echo "|---|---|---|---|---|---|---|"
} > "$tmp/table.md"

status=0
for c in "${cases[@]}"; do
    IFS='|' read -r name kernel stem args per inner <<< "$c"
    dir=$tmp/emit-${kernel}-$RANDOM
    # shellcheck disable=SC2086
    if ! "$build/clattn" emit --out "$dir" --target sm_90 $args > "$tmp/emit.txt" 2>&1; then
        echo "| $name | emit failed: $(tail -1 "$tmp/emit.txt") | | | | | |" >> "$tmp/table.md"; status=1; continue
    fi
    if [ "$stem" = flash_backward_gemm ]; then
        params=$(sed -n 's/.*backward [a-z_]* (\([^)]*\)).*/\1/p' "$tmp/emit.txt" | head -1)
    else
        params=$(sed -n 's/.*core [a-z_]* (\([^)]*\)).*/\1/p' "$tmp/emit.txt" | head -1)
    fi
    defs=$(tr ' ' '\n' < "$dir/$stem.opts" | grep '^-D' | tr '\n' ' ')
    [ -n "$params" ] || params=$(echo "$defs" | tr ' ' '\n' | grep -E '^-D(WG|LANES|KT|VW|R|GV_[A-Z]+)=' | sed 's/^-D//' | paste -sd, -)
    # shellcheck disable=SC2086
    if ! PATH=$tmp/bin:$PATH bash "$check" --sass "$kernel" $defs "$dir/$stem.cl" > "$tmp/check.txt" 2>&1; then
        echo "| $name | $params | ptx-check failed: $(grep -m1 -i error "$tmp/check.txt") | | | | |" >> "$tmp/table.md"; status=1; continue
    fi
    python3 - "$name" "$kernel" "$per" "$params" "$tmp/check.txt" /tmp/ptx-check.sass "$inner" >> "$tmp/table.md" <<'EOF' || status=1
import re, sys
name, kernel, per, params, check, sass = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
passes = [int(x) for x in sys.argv[7].split(",") if x]
text = open(check).read()
m = re.search(rf"^{kernel}: Used (\d+) registers.*?(\d+) bytes spill stores, (\d+) bytes spill loads", text, re.M)
regs, spills = (m.group(1), f"{m.group(2)}/{m.group(3)} B") if m else ("?", "?")
loops = re.findall(r"loop (0x[0-9a-f]+)-(0x[0-9a-f]+)([^:]*): (\d+) instr \(([^)]*)\)\n\s+math share (\d+)%; per iteration: ([^;]*); bound by ([^;]*); ceiling (\d+) TFLOP/s", text)
loops = [(lo, hi, n, mix + ("; " + nest.strip(", ") + ": their work is not in the figures" if nest.strip() else ""), share, clocks,
          bound, tf) for lo, hi, nest, n, mix, share, clocks, bound, tf in loops]
if not loops:
    print(f"| {name} | {params} | {regs} | {spills} | no loop found | | |")
    sys.exit(0)
key = lambda l: int(l[2])  # the loop of the most instructions: the tile loop
lo, hi, n, mix, share, clocks, bound, tf = max(loops, key=key)
nested = sorted((l for l in loops if int(lo, 16) < int(l[0], 16) and int(l[1], 16) < int(hi, 16)), key=lambda l: int(l[0], 16))
if len(nested) != len(passes):
    print(f"| {name} | {params} | {regs} | {spills} | {len(nested)} loops nested in the hot loop, {len(passes)} pass counts "
          f"given (gpu-static.sh's case table) | | |")
    sys.exit(1)
if nested:
    # fold each nested loop in, times its passes: instructions by class, the four clocks, and the useful work (a
    # loop's ceiling times its bounding clock)
    pipes = ("issue", "fma pipe", "tensor pipe", r"shared mem \(no broadcast\)")
    clk = lambda text: [float(re.search(p + r" ([\d.]+) clk", text).group(1)) for p in pipes]
    classes = lambda text: {k: int(v) for v, k in (x.split(" ") [::-1] for x in re.findall(r"[a-z]+ \d+", text))}
    total, work = clk(clocks), int(tf) * max(clk(clocks))
    count = classes(mix.split(";")[0])
    n = int(n)
    for l, t in zip(nested, passes):
        c = clk(l[5])  # l: lo, hi, instructions, mix, share, clocks, bound, ceiling
        total = [a + t * b for a, b in zip(total, c)]
        work += t * int(l[7]) * max(c)
        n += t * int(l[2])
        for k, v in classes(l[3]).items():
            count[k] = count.get(k, 0) + t * v
    names = ["issue", "fma pipe", "tensor pipe", "shared mem (no broadcast)"]
    bound = names[max(range(4), key=lambda i: total[i])]
    clocks = ", ".join(f"{k} {v:.1f} clk" for k, v in zip(names, total))
    tf = str(round(work / max(total)))
    mix = ", ".join(f"{k} {v}" for k, v in count.items()) + "; with " + ", ".join(
        f"the loop at {l[0]} x {t}" for l, t in zip(nested, passes))
    share = str(round(100 * (count.get("fma", 0) + count.get("mma", 0)) / n))
issue = float(re.search(r"issue ([\d.]+) clk", clocks).group(1))
if per:
    ceiling = f"**{int(tf) / per:.0f}** useful TFLOP/s" + (f" ({tf} of mma work)" if per > 1 else "")
else:
    # bytes the loop loads per iteration: each LDG's width (.64, .128; else 32 bits) between lo and hi of this kernel
    body, inside, nbytes = open(sass).read(), False, 0
    for line in body.splitlines():
        if line.startswith("\t.text.") or line.startswith(".text."):
            inside = line.strip().rstrip(":").endswith(kernel)
        a = re.search(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?(LDG[\w.]*)", line)
        if inside and a and int(lo, 16) <= int(a.group(1), 16) <= int(hi, 16):
            w = re.search(r"\.(64|128|U8|S8|U16|S16)\b", a.group(3))
            nbytes += {"64": 8, "128": 16, "U8": 1, "S8": 1, "U16": 2, "S16": 2}[w.group(1)] if w else 4
    nbytes *= 32  # a warp's lanes
    tbs = nbytes / issue * 132 * 1.755e9 / 1e12 if issue else 0
    ceiling = f"{nbytes} B per warp-iteration in {issue:.1f} issue clk: **{tbs:.1f} TB/s** at the issue bound (HBM 3.35)"
print(f"| {name} | {params} | {regs} | {spills} | {n} ({mix}); math {share}% | {bound} ({clocks}) | {ceiling} |")
EOF
done
if [ -n "$out" ]; then cp "$tmp/table.md" "$out"; echo "gpu-static.sh: wrote $out"; fi
cat "$tmp/table.md"
exit $status
