#!/usr/bin/env bash
# bench/gpu/measure.sh: one device call's worth of checks and timings on an NVIDIA GPU, run there from the
# project root after `bash ../shared/gpu/prepare.sh` here (carry .gpu and build):
#   bash bench/gpu/measure.sh [SECTION...]     (default: every section, in this order)
# Sections: info selftest cores torch dtype decode conformance (the default run), sweep (flash_mma's half products
# over its parameters), serve (paged and verify decode steps), serve_ab (the paged step, OLD's build against this),
# decode_params (decode_group's parameters on half caches and verify steps), and plain (the README's ctest
# command, every family at AUTO), accum (flash_mma's long sums, and its core against OLD's), python (the Python tests on
# the GPU), probe gemm matrix auto
# backward tune (a second call: the sub-buffer probe, test_gemm on CLBlast, every family of the cores MATRIX names,
# AUTO on CONFIGS and head size 256, the backward cores, `clattn tune`
# on TUNE_SHAPES for TUNE_BUDGET seconds and AUTO on CONFIGS with what it kept). Each has a timeout and the whole run a
# budget (BUDGET seconds, default 420): a section that would start after it is skipped, named in the log.
# Results under $OUT: log.txt (every section's text, one summary line per measurement), selftest.txt,
# ctest.txt, bench.jsonl (clattn-bench), torch.jsonl (PyTorch's attention core on the same GPU).
root=$PWD; kit=$root/.gpu
OUT=${OUT:-/tmp/clattn-gpu}; mkdir -p "$OUT"; log=$OUT/log.txt
dev=${DEV:-gpu}
budget=${BUDGET:-420}; t0=$(date +%s)
lib=$(ldconfig -p | awk '/libnvidia-opencl\.so/{print $NF; exit}')
[ -n "$lib" ] || lib=$(find / -xdev -name 'libnvidia-opencl.so*' 2>/dev/null | head -1)
echo "NVIDIA OpenCL library: ${lib:-none found}" | tee -a "$log"
[ -z "$lib" ] || { mkdir -p /tmp/icd && echo "$lib" > /tmp/icd/nvidia.icd && export OCL_ICD_VENDORS=/tmp/icd; }
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' build/CMakeCache.txt)
if [ -n "$src" ] && [ "$src" != "$root" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; fi
# the python3 the tests were configured with (the script checks and the Python entries run it): this machine's, where
# that path is missing here (a pyenv shim, say)
py=$(sed -n 's/^_Python3_EXECUTABLE:INTERNAL=//p' build/CMakeCache.txt)
if [ -n "$py" ] && [ ! -e "$py" ] && command -v python3 > /dev/null; then
  mkdir -p "$(dirname "$py")" && ln -s "$(command -v python3)" "$py"
fi
export CLATTN_CACHE_DIR=/tmp/clattn-cache
cl() { LD_LIBRARY_PATH=$kit/lib "$@"; }
configs=${CONFIGS:-"4 512 512 8,2 4096 1024 16,4 2048 1024 8"}
cores=${CORES:-"flash_rows flash_tiled flash_gemm flash_mma flash_mma@tf32 unfused"}
summary() {
  python3 - "$1" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    o = json.loads(l)
    if o.get("mode") == "decode":
        print(f"decode B{o['batch']} C{o['context']} {o['kv_type']} {o.get('core','')} splits {o['splits']}: {o['step_ms']:.3f} ms, "
              f"KV {o['kv_gbps']:.0f} GB/s of copy {o['copy_gbps']:.0f}")
    elif "backend" in o:
        print(f"torch {o['B']} {o['T']} {o['E']} {o['H']} {'causal' if o['causal'] else '      '} {o['dtype']:8s} {o['backend']:9s} "
              + (f"{o['median_ms']:.3f} ms {o['tflops']:.1f} TFLOP/s" if 'median_ms' in o else o.get('error', '')))
    elif "variant" in o:
        print(f"torch {o['variant']} n={o['n']}: {o['tflops']:.1f} TFLOP/s")
    elif "batch" in o:
        print(f"{o.get('binary', '') + ' r' + str(o['round']) + ' ' if 'binary' in o else ''}"
              f"{o['batch']} {o['seq']} {o['dim']} {o['heads']} {'causal' if o['causal'] else '      '} {o['dtype']} {o['precision']} "
              f"{'core-only ' if o.get('no_proj') else ''}"
              f"{o['core']:11s} {o['median_ms']:.3f} ms, core {o.get('core_ms') or 0:.3f} ms {(o.get('core_gflops') or 0) / 1000:.1f} TFLOP/s, "
              f"proj {(o.get('projection_gflops') or 0) / 1000:.1f} TFLOP/s, first call {o['first_call_ms']:.0f} ms [{o.get('core_params')}]")
PY
}
serve_summary() {  # one line per decode step record (serve, serve_ab, decode_params)
  python3 - "$1" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    o = json.loads(l)
    tag = (f"{o['binary']} r{o['round']} " if 'binary' in o else "") + (f"[{o['set']}] " if 'set' in o else "")
    print(f"serve {tag}B{o['batch']} C{o['context']} {o['kv_type']} page {o.get('page_size', 0)} q{o['new_tokens']} {o['core']} "
          f"splits {o['splits']}: {o['step_ms']:.3f} ms, attend {o['stages_ms']['attend']:.3f} ms")
PY
}
bench() {  # bench ARGS...: one clattn-bench configuration, its JSON line appended
  cl timeout 40 build/clattn-bench --device "$dev" --iters 10 --warmup 2 --json "$@" 2>>"$log" | grep '^{' >> "$OUT/bench.jsonl" ||
    echo "bench $* failed" | tee -a "$log"
}
[ $# -gt 0 ] || set -- info selftest cores torch dtype decode conformance
for s in "$@"; do
  now=$(( $(date +%s) - t0 ))
  if [ "$now" -ge "$budget" ]; then echo "=== $s skipped: ${now}s of the ${budget}s budget spent" | tee -a "$log"; continue; fi
  echo "=== $s at ${now}s" | tee -a "$log"
  case $s in
    info) nvidia-smi -L 2>&1 | tee -a "$log"; cl build/clattn devices 2>&1 | tee -a "$log"
          cl build/clattn cores --device "$dev" 2>&1 | tee -a "$log" ;;
    selftest) CLATTN_CACHE_DIR=/tmp/clattn-selftest cl timeout 120 build/clattn selftest --device "$dev" > "$OUT/selftest.txt" 2>&1
              echo "selftest exit $?" | tee -a "$log"; cat "$OUT/selftest.txt" >> "$log" ;;
    conformance) CLATTN_TEST_DEVICE=$dev cl timeout $((budget + 60 - now)) ctest --test-dir build -LE matrix -R '_core_' -j12 --timeout 160 \
                   --output-on-failure > "$OUT/ctest.txt" 2>&1
                 echo "ctest exit $?" | tee -a "$log"; grep -E 'tests passed|Failed|\*\*\*|Passed|Not Run|Skipped' "$OUT/ctest.txt" | tee -a "$log" ;;
    cores) n=0; IFS=, read -ra cs <<< "$configs"
           for c in "${cs[@]}"; do set -- $c
             for k in $cores; do prec=fp32; [ "${k#*@}" != "$k" ] && prec=${k#*@}
               bench --batch "$1" --seq "$2" --dim "$3" --heads "$4" --core "${k%@*}" --precision "$prec"
               [ "$n" = 1 ] && bench --batch "$1" --seq "$2" --dim "$3" --heads "$4" --core "${k%@*}" --precision "$prec" --causal
             done; n=$((n + 1))
           done
           bench --batch 2 --seq 4096 --dim 1024 --heads 16   # AUTO's choice
           summary "$OUT/bench.jsonl" | tee -a "$log" ;;
    dtype) # the core alone on half arrays (--no-proj: flash_mma's m16n8k16 products), against torch's fp16 SDPA core
           # (the torch section's f16 rows); then the module (projections: flash_mma's core reads their fp32 output)
           for dt in f16 bf16; do for k in flash_mma flash_gemm; do
             bench --batch 2 --seq 4096 --dim 1024 --heads 16 --core $k --dtype $dt --no-proj; done; done
           bench --batch 2 --seq 4096 --dim 1024 --heads 16 --core flash_mma --dtype f16 --no-proj --causal
           bench --batch 4 --seq 2048 --dim 1024 --heads 8 --core flash_mma --dtype f16 --no-proj
           bench --batch 4 --seq 2048 --dim 1024 --heads 8 --core flash_mma --dtype bf16 --no-proj
           bench --batch 2 --seq 4096 --dim 1024 --heads 16 --core flash_mma --no-proj   # fp32 (3xTF32) beside them
           bench --batch 2 --seq 4096 --dim 1024 --heads 16 --core flash_mma --dtype f16
           summary "$OUT/bench.jsonl" | grep -E ' (f16|bf16) ' | tee -a "$log" ;;
    torch) timeout 150 python3 "$root/bench/gpu/torch_core.py" "${TORCH_CONFIGS:-$configs}" > "$OUT/torch.jsonl" 2>>"$log"
           summary "$OUT/torch.jsonl" | tee -a "$log" ;;
    decode) for kv in "" --kv-half; do for core in decode_attend decode_group; do
              CLATTN_CORE=$core cl timeout 60 build/clattn-bench --device "$dev" --decode --context 32768 --batch 1,8 --heads 32 \
                --kv-heads 8 $kv --iters 20 --json 2>>"$log" | grep '^{' >> "$OUT/decode.jsonl" ||
                echo "decode $core $kv failed" | tee -a "$log"
            done; done; summary "$OUT/decode.jsonl" | tee -a "$log" ;;
    sweep) # flash_mma's half products over its tuning space (SWEEP_PARAMS: "P=V,..." sets; the defaults first), the core
           # alone on f16 arrays at d64 and d128 (SWEEP_SHAPES), two rounds alternating the sets
           # (the defaults against PF, the next tile in registers: bench/results/h200-2026-11-27b.md swept the rest)
           sets=${SWEEP_PARAMS:-"- PF=1 BK=32,PF=1 NW=8,QREG=0 NW=8,QREG=0,PF=1"}
           shapes=${SWEEP_SHAPES:-"2 4096 1024 16,4 2048 1024 8"}
           IFS=, read -ra ss <<< "$shapes"
           for round in 1 2; do for c in "${ss[@]}"; do set -- $c; for p in $sets; do
             k=flash_mma; [ "$p" = - ] || k=flash_mma:$p
             cl timeout 40 build/clattn-bench --device "$dev" --iters 10 --warmup 2 --json --batch "$1" --seq "$2" --dim "$3" \
               --heads "$4" --core "$k" --dtype "${SWEEP_DTYPE:-f16}" --no-proj 2>>"$log" |
               awk -v r=$round -v p="$p" '/^\{/ {sub(/^\{/, "{\"round\":" r ",\"set\":\"" p "\","); print; n++} END {exit n == 0}' \
               >> "$OUT/bench.jsonl" || echo "sweep $c $p failed" | tee -a "$log"
           done; done; done
           summary "$OUT/bench.jsonl" | tee -a "$log" ;;
    serve) # issue 40 on the GPU: paged (pages of 16) against contiguous, and a q=8 tree verify against q=1, float and
           # half caches, batch 1 and 8, contexts 4k-32k
           for C in ${SERVE_CONTEXTS:-4096 32768}; do for kv in float half; do for ps in 0 16; do
             cl timeout 60 build/clattn-bench --device "$dev" --decode --context $C --batch 1,8 --heads 32 --kv-heads 8 \
               --kv-type $kv $([ "$ps" = 0 ] || echo --page-size "$ps") --iters 20 --json 2>>"$log" | grep '^{' >> "$OUT/serve.jsonl" ||
               echo "serve $kv page $ps failed" | tee -a "$log"
           done
             cl timeout 60 build/clattn-bench --device "$dev" --decode --context $C --batch 1,8 --heads 32 --kv-heads 8 \
               --kv-type $kv --new-tokens 8 --tree --iters 20 --json 2>>"$log" | grep '^{' >> "$OUT/serve.jsonl" ||
               echo "serve $kv verify failed" | tee -a "$log"
           done; done
           serve_summary "$OUT/serve.jsonl" | tee -a "$log" ;;
    serve_ab) # decode steps of an earlier build's clattn-bench (OLD: a folder with it) against this build's: contiguous
           # and paged float caches, a half cache; rounds alternating
           old=${OLD:-.gpu/old}
           for round in 1 2; do for b in "$old/clattn-bench" build/clattn-bench; do [ -x "$b" ] || continue
             for c in "--context 4096" "--context 4096 --page-size 16" "--context 32768" "--context 32768 --page-size 16" \
                      "--context 32768 --kv-type half"; do
               cl timeout 60 "$b" --device "$dev" --decode $c --batch 1,8 --heads 32 --kv-heads 8 --iters 20 --json 2>>"$log" |
                 awk -v r=$round -v p="$b" '/^\{/ {sub(/^\{/, "{\"binary\":\"" p "\",\"round\":" r ","); print; n++} END {exit n == 0}' \
                 >> "$OUT/serve.jsonl" || echo "serve_ab $b $c failed" | tee -a "$log"
           done; done; done
           serve_summary "$OUT/serve.jsonl" | tee -a "$log" ;;
    decode_params) # decode_group's parameters (DECODE_SETS: "P=V,..." sets, - the defaults) on a half cache's step and on a
           # float cache's q=8 tree verify, contexts 4096 and 32768, batch 1 and 8
           for C in 4096 32768; do for kv in half verify; do
             for p in ${DECODE_SETS:-- LANES=16 VW=4,LANES=16 LANES=32,R=8 LANES=32,R=8,KT=1}; do
               k=decode_group; [ "$p" = - ] || k=decode_group:$p
               a="--kv-type half"; [ $kv = verify ] && a="--new-tokens 8 --tree"
               CLATTN_CORE=$k cl timeout 60 build/clattn-bench --device "$dev" --decode --context $C $a --batch 1,8 --heads 32 \
                 --kv-heads 8 --iters 20 --json 2>>"$log" |
                 awk -v p="$p" '/^\{/ {sub(/^\{/, "{\"set\":\"" p "\","); print; n++} END {exit n == 0}' \
                 >> "$OUT/params.jsonl" || echo "decode_params $C $kv $p failed" | tee -a "$log"
           done; done; done
           serve_summary "$OUT/params.jsonl" | tee -a "$log" ;;
    probe) cl timeout 30 .gpu/subbuf_probe 2>&1 | tee -a "$log" ;;   # built by: cc -o .gpu/subbuf_probe bench/gpu/subbuf_probe.c ...
    gemm) CLATTN_CORE=gemm_clblast CLATTN_TEST_DEVICE=$dev cl timeout 60 build/test_gemm --verbose 2>&1 | grep -E 'FAIL|PASS|Failed|Synthesis|\[----\]' | tee -a "$log" ;;
    accum) # flash_mma's sums over long rows: the long module test and test_mma's accumulation cases, and flash_mma's core
           # timed against an earlier build's (OLD: a folder with its clattn-bench and test_fused), rounds alternating
           old=${OLD:-.gpu/old}
           for b in "$old/test_fused" build/test_fused; do [ -x "$b" ] || continue
             echo "-- $b" | tee -a "$log"; CLATTN_TEST_DEVICE=$dev cl timeout 90 "$b" --filter 'long/t32768_causal_fused' --verbose 2>&1 |
               grep -E 'worst|Synthesis|got' | tee -a "$log"; done
           CLATTN_TEST_DEVICE=$dev cl timeout 60 build/test_mma --filter 'toward_zero/*' --verbose 2>&1 | grep -E 'worst|PASS|FAIL|got|Assert' | tee -a "$log"
           for round in 1 2; do for b in "$old/clattn-bench" build/clattn-bench; do [ -x "$b" ] || continue
             for c in "--batch 2 --seq 4096 --heads 16" "--batch 2 --seq 4096 --heads 16 --dtype f16" "--batch 4 --seq 2048 --heads 8 --dtype f16"; do
               cl timeout 40 "$b" --device "$dev" --iters 10 --warmup 2 --json --dim 1024 --core flash_mma --no-proj $c 2>>"$log" |
                 grep '^{' | sed "s#^{#{\"binary\":\"$b\",\"round\":$round,#" >> "$OUT/bench.jsonl" || echo "bench $b $c failed" | tee -a "$log"
             done; done; done
           summary "$OUT/bench.jsonl" | tee -a "$log" ;;
    plain) # the README's test command on the GPU: every family at AUTO (flash_mma on NVIDIA), each core's conformance
           # (PLAIN_REGEX: only the tests it matches)
           CLATTN_TEST_DEVICE=$dev cl timeout $((budget + 60 - now)) ctest --test-dir build -LE matrix ${PLAIN_REGEX:+-R "$PLAIN_REGEX"} -j12 --timeout 150 \
             --output-on-failure > "$OUT/plain.txt" 2>&1
           echo "plain exit $?" | tee -a "$log"; grep -E 'tests passed|Failed|\*\*\*|Not Run|Skipped|Total Test' "$OUT/plain.txt" | tee -a "$log" ;;
    python) # the Python tests with clattn on the GPU (half tensors on flash_mma's fp16/bf16 products, autograd)
            CLATTN_DEVICE=$dev CLATTN_LIBRARY=$root/build/libclattn.so PYTHONPATH=$root/python cl timeout 150 \
              python3 -m pytest -q -p no:cacheprovider "$root/python/tests" > "$OUT/python.txt" 2>&1
            echo "python exit $?" | tee -a "$log"; grep -E 'passed|failed|FAILED|Error' "$OUT/python.txt" | tail -30 | tee -a "$log" ;;
    matrix) CLATTN_TEST_DEVICE=$dev cl timeout $((budget + 60 - now)) ctest --test-dir build -L matrix -R "${MATRIX:-_core_flash_mma}" \
              -j12 --timeout 150 --output-on-failure > "$OUT/matrix.txt" 2>&1
            echo "matrix exit $?" | tee -a "$log"; grep -E 'tests passed|Failed|\*\*\*|Passed|Not Run|Skipped' "$OUT/matrix.txt" | tee -a "$log" ;;
    auto) IFS=, read -ra cs <<< "$configs"
          for c in "${cs[@]}"; do set -- $c; bench --batch "$1" --seq "$2" --dim "$3" --heads "$4"
            bench --batch "$1" --seq "$2" --dim "$3" --heads "$4" --causal; done
          for k in flash_mma flash_gemm unfused; do bench --batch 1 --seq 4096 --dim 2048 --heads 8 --core $k; done
          summary "$OUT/bench.jsonl" | tee -a "$log" ;;
    backward) for k in flash_backward flash_backward_gemm; do
                CLATTN_CORE=$k cl timeout 60 build/clattn-bench --device "$dev" --backward --batch 2 --seq 4096 --dim 1024 \
                  --heads 16 --iters 5 --json 2>>"$log" | grep '^{' >> "$OUT/backward.jsonl" || echo "backward $k failed" | tee -a "$log"
              done; cat "$OUT/backward.jsonl" | cut -c1-600 | tee -a "$log" ;;
    tune) export CLATTN_TUNE_FILE=$OUT/tune.txt
          cl timeout $((budget + 30 - now)) build/clattn tune --device "$dev" --budget "${TUNE_BUDGET:-100}" \
            --shapes "${TUNE_SHAPES:-4,2048,1024,8;2,4096,1024,16}" --clblast never 2>&1 | tee "$OUT/tune.log" | tail -40 | tee -a "$log"
          cat "$OUT/tune.txt" >> "$log" 2>/dev/null
          IFS=, read -ra cs <<< "$configs"
          for c in "${cs[@]}"; do set -- $c; bench --batch "$1" --seq "$2" --dim "$3" --heads "$4"; done
          summary "$OUT/bench.jsonl" | tee -a "$log"; unset CLATTN_TUNE_FILE ;;
    *) echo "unknown section $s" | tee -a "$log" ;;
  esac
done
echo "=== done at $(( $(date +%s) - t0 ))s" | tee -a "$log"
