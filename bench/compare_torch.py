#!/usr/bin/python3
"""compare_torch.py: clattn-bench side by side with PyTorch on the CPU.

For each sequence length, the same module (self-attention, Q/K/V + output
projections with biases, B x T x E input, H heads) is timed
  - by `clattn-bench --json` on every clattn device asked for (--devices,
    default "opencl@fused,opencl@unfused,ref": DEVICE@ALGORITHM passes
    --algorithm to clattn-bench), and
  - by torch.nn.MultiheadAttention (batch_first=True, eval(), torch.no_grad(),
    need_weights=False) on the CPU with torch.set_num_threads(--threads, 2),
  - and by F.scaled_dot_product_attention between F.linear projections when
    this torch has it (torch >= 2.0; 1.13 does not: reported as skipped),
  - and the projections alone: torch's F.linear (and bare matmuls, no bias)
    on the same shapes against clattn's projection stages (clattn-bench's
    "projection_gflops", with the GEMM core that ran them; --gemm picks
    another).
It prints a table (milliseconds, GFLOP/s, clattn/torch ratios) and draws
GFLOP/s against sequence length to --plot (PNG, matplotlib).

FLOPs use clattn-bench's convention: projections 2*M*N*K each (QKV
2*(B*T)*(3E)*E, out 2*(B*T)*E*E), core 4*B*H*T^2*d, halved when causal.

Run with the system Python, from the repository root after building:
    /usr/bin/python3 bench/compare_torch.py --seqs 64,128,256,512,1024
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def flops(B, T, E, H, causal):
    proj = 2.0 * (B * T) * (3 * E) * E + 2.0 * (B * T) * E * E
    core = 4.0 * B * H * T * T * (E // H) * (0.5 if causal else 1.0)
    return proj + core


# ---------------------------------------------------------------- shared machines

def cpu_sample():
    """(all CPUs' busy seconds from /proc/stat, this process's + reaped children's CPU seconds, wall), or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    tck = os.sysconf("SC_CLK_TCK")
    own = os.times()
    return ((v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / tck,
            own.user + own.system + own.children_user + own.children_system, time.perf_counter())


def interference(a, b):
    """Share of all CPUs that other processes used between samples a and b (None if unknown)."""
    if a is None or b is None or b[2] <= a[2]:
        return None
    others = max(0.0, (b[0] - a[0]) - (b[1] - a[1]))
    return others / ((b[2] - a[2]) * (os.cpu_count() or 1))


def settle(max_s):
    """Wait up to max_s seconds for two 1-second windows in a row with the CPUs >= 95% idle."""
    end, quiet, a = time.time() + max_s, 0, cpu_sample()
    if a is None:
        return False
    while time.time() < end:
        time.sleep(1)
        b = cpu_sample()
        f = interference(a, b)
        quiet = quiet + 1 if f is not None and f <= 0.05 else 0
        if quiet >= 2:
            return True
        a = b
    return False


def guarded(args, what, fn):
    """Run fn() after settling; redo it (up to --retries times) while other processes took more than
    --max-interference of the CPUs meanwhile. Returns (result, interference)."""
    for attempt in range(1 + max(0, args.retries)):
        if args.settle > 0 and not settle(args.settle):
            log("compare_torch.py: CPUs not idle within --settle %g s; measuring %s anyway" % (args.settle, what))
        a = cpu_sample()
        r = fn()
        f = interference(a, cpu_sample())
        if f is None or args.max_interference <= 0 or f <= args.max_interference:
            return r, f
        log("compare_torch.py: %s: other processes used %.0f%% of the CPUs; measuring again" % (what, 100 * f))
    return r, f


def summarize(times_ms):
    return {"median_ms": statistics.median(times_ms), "min_ms": min(times_ms), "max_ms": max(times_ms)}


# ---------------------------------------------------------------- torch

def blas_report(torch):
    """Which BLAS torch's matmul really runs on, and how fast it is (reference BLAS is ~100x slower)."""
    lines = []
    cfg = torch.__config__.show()
    info = re.findall(r"\b(?:BLAS_INFO|LAPACK_INFO)=[^,\s]*", cfg)
    lines.append("torch %s; build: %s" % (torch.__version__, ", ".join(info) or "BLAS_INFO not shown"))
    alt = "/etc/alternatives/libblas.so.3-" + platform.machine() + "-linux-gnu"
    if os.path.exists(alt):
        lines.append("libblas.so.3 -> %s (update-alternatives)" % os.path.realpath(alt))
    try:  # the libraries actually mapped into this process
        with open("/proc/self/maps") as f:
            libs = sorted({l.split()[-1] for l in f if "blas" in l.lower() and "/" in l})
        if libs:
            lines.append("mapped: " + ", ".join(os.path.basename(l) for l in libs))
    except OSError:
        pass
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    for _ in range(5):
        a @ b
    t = []
    for _ in range(10):
        t0 = time.perf_counter()
        a @ b
        t.append(time.perf_counter() - t0)
    rate = 2 * 1024 ** 3 / statistics.median(t) / 1e9
    lines.append("torch matmul 1024^3 on %d threads: %.1f GFLOP/s%s" % (
        torch.get_num_threads(), rate, "" if rate > 5 else "  <-- looks like reference BLAS"))
    return lines, rate


def time_torch(torch, fn, x, iters, warmup):
    with torch.no_grad():
        for _ in range(warmup):
            fn(x)
        t = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn(x)
            t.append((time.perf_counter() - t0) * 1e3)
    return summarize(t)


def torch_configs(torch, B, T, E, H, causal, iters, warmup):
    F = torch.nn.functional
    torch.manual_seed(T)
    mha = torch.nn.MultiheadAttention(E, H, bias=True, batch_first=True).eval()
    x = torch.rand(B, T, E) * 2 - 1
    mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1) if causal else None
    res = {"mha": time_torch(torch, lambda v: mha(v, v, v, need_weights=False, attn_mask=mask)[0], x, iters, warmup)}
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is not None:
        w_in, b_in = mha.in_proj_weight, mha.in_proj_bias
        w_out, b_out = mha.out_proj.weight, mha.out_proj.bias
        d = E // H

        def run(v):
            q, k, vv = F.linear(v, w_in, b_in).split(E, dim=-1)
            q, k, vv = (t.view(B, T, H, d).transpose(1, 2) for t in (q, k, vv))
            o = sdpa(q, k, vv, is_causal=bool(causal))
            return F.linear(o.transpose(1, 2).reshape(B, T, E), w_out, b_out)

        res["sdpa"] = time_torch(torch, run, x, iters, warmup)
    # the projections alone, the same shapes as clattn's (x W_in^T + b_in, o W_out^T + b_out over B*T rows)
    w_in, b_in = mha.in_proj_weight.detach(), mha.in_proj_bias.detach()
    w_out, b_out = mha.out_proj.weight.detach(), mha.out_proj.bias.detach()
    x2 = x.reshape(B * T, E)
    proj_flops = 2.0 * B * T * 3 * E * E + 2.0 * B * T * E * E
    proj = time_torch(torch, lambda v: (F.linear(v, w_in, b_in), F.linear(v, w_out, b_out)), x2, iters, warmup)
    proj["gflops"] = proj_flops / (proj["median_ms"] * 1e6)
    res["projections"] = proj
    # and as bare matmuls (no bias) on the same shapes: the BLAS rate itself
    wt_in, wt_out = w_in.t().contiguous(), w_out.t().contiguous()
    pmm = time_torch(torch, lambda v: (v @ wt_in, v @ wt_out), x2, iters, warmup)
    pmm["gflops"] = proj_flops / (pmm["median_ms"] * 1e6)
    res["projections_matmul"] = pmm
    # the ceiling: one OpenBLAS SGEMM with the same FLOP count, square-ish
    n = max(16, int(round((flops(B, T, E, H, causal) / 2) ** (1 / 3) / 16)) * 16)
    k = max(16, int(round(flops(B, T, E, H, causal) / (2 * n * n) / 16)) * 16)
    a, b = torch.rand(n, k), torch.rand(k, n)
    mm = time_torch(torch, lambda _: a @ b, None, iters, warmup)
    mm["gflops"] = 2.0 * n * n * k / (mm["median_ms"] * 1e6)
    res["matmul"] = mm
    return res


# ---------------------------------------------------------------- clattn-bench

def run_bench(bench, device, B, T, E, H, causal, iters, warmup, gemm=""):
    """device: a clattn device spec, optionally with @fused / @unfused / @auto for --algorithm."""
    spec, _, algorithm = device.partition("@")
    cmd = [bench, "--json", "--device", spec, "--batch", str(B), "--seq", str(T), "--dim", str(E),
           "--heads", str(H), "--iters", str(iters), "--warmup", str(warmup)]
    if gemm and spec != "ref":
        cmd += ["--gemm", gemm]
    if algorithm:
        cmd += ["--algorithm", algorithm]
    if causal:
        cmd.append("--causal")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s failed (exit %d):\n%s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if len(lines) != 1:
        raise RuntimeError("%s: expected one JSON line, got:\n%s" % (" ".join(cmd), p.stdout))
    r = json.loads(lines[0])
    r["command"] = " ".join(cmd[1:])
    return r


# ---------------------------------------------------------------- output

def fmt(v, spec="%.2f"):
    return "-" if v is None else spec % v


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default="64,128,256,512,1024", help="comma-separated sequence lengths")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--build-dir", default="build", help="where clattn-bench was built (default build)")
    ap.add_argument("--devices", default="opencl@fused,opencl@unfused,ref",
                    help="clattn devices, comma-separated, each optionally DEVICE@fused|unfused|auto "
                         "(default opencl@fused,opencl@unfused,ref)")
    ap.add_argument("--ref-iters", type=int, default=3, help="iterations on ref, the slow plain-C reference (default 3)")
    ap.add_argument("--ref-budget", type=float, default=60.0,
                    help="skip a ref configuration projected to take longer, in seconds (default 60)")
    ap.add_argument("--plot", default="bench/out/gflops.png", help="PNG to draw (default bench/out/gflops.png)")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="shared machines: before each measurement wait up to this many seconds for idle CPUs")
    ap.add_argument("--max-interference", type=float, default=0.0,
                    help="redo a measurement while other processes used more than this share of the CPUs "
                         "(e.g. 0.05; default 0: never)")
    ap.add_argument("--retries", type=int, default=3, help="at most this many redos per measurement (default 3)")
    ap.add_argument("--json-out", default="", help="also write every row (clattn-bench's JSON and torch's figures) "
                    "to this file, one JSON object per line")
    ap.add_argument("--gemm", default="", help="clattn-bench --gemm NAME[:P=V,...]: the GEMM core to run")
    a = ap.parse_args()
    try:
        seqs = [int(s) for s in a.seqs.split(",") if s.strip()]
    except ValueError:
        ap.error("--seqs: comma-separated integers expected")
    if not seqs or min(seqs) < 1 or min(a.batch, a.dim, a.heads, a.iters) < 1 or a.dim % a.heads:
        ap.error("positive sizes expected, and --heads must divide --dim")
    devices = [d for d in a.devices.split(",") if d]
    bench = os.path.join(a.build_dir, "clattn-bench")
    if devices and not os.access(bench, os.X_OK):
        sys.exit("compare_torch.py: %s not found: build first (cmake -S . -B build && cmake --build build)" % bench)

    import torch
    torch.set_num_threads(a.threads)
    B, E, H, causal = a.batch, a.dim, a.heads, a.causal
    blas_lines, _ = blas_report(torch)
    for l in blas_lines:
        log("compare_torch.py: " + l)
    have_sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    if not have_sdpa:
        log("compare_torch.py: torch %s has no F.scaled_dot_product_attention: SDPA skipped" % torch.__version__)

    rows = []
    ref_last = None  # (flops, seconds) of the last ref run, to project the next
    for T in seqs:
        row = {"T": T, "flops": flops(B, T, E, H, causal), "clattn": {}, "skipped": {}, "others": {}}
        for dev in devices:
            is_ref = dev == "ref"
            iters, warmup = (a.ref_iters, 0) if is_ref else (a.iters, a.warmup)
            if is_ref and ref_last:
                projected = ref_last[1] * row["flops"] / ref_last[0]
                if projected > a.ref_budget:
                    row["skipped"][dev] = "projected %.0f s > --ref-budget %.0f s" % (projected, a.ref_budget)
                    log("compare_torch.py: T=%d on %s skipped: %s" % (T, dev, row["skipped"][dev]))
                    continue
            log("compare_torch.py: T=%d clattn-bench --device %s ..." % (T, dev))
            t0 = time.perf_counter()
            row["clattn"][dev], row["others"][dev] = guarded(
                a, "T=%d on %s" % (T, dev), lambda: run_bench(bench, dev, B, T, E, H, causal, iters, warmup, a.gemm))
            if is_ref:
                ref_last = (row["flops"], time.perf_counter() - t0)
        log("compare_torch.py: T=%d torch ..." % T)
        row["torch"], row["others"]["torch"] = guarded(
            a, "T=%d torch" % T, lambda: torch_configs(torch, B, T, E, H, causal, a.iters, a.warmup))
        rows.append(row)

    # ---- table
    dev_cls = [d for d in devices if d != "ref"]
    print("B=%d E=%d H=%d %s; clattn: median of %d (ref: %d) after %d warm-up; torch: median of %d, %d threads" % (
        B, E, H, "causal" if causal else "non-causal", a.iters, a.ref_iters, a.warmup, a.iters, a.threads))
    for l in blas_lines:
        print("  " + l)
    if rows:
        for dev in devices:
            r0 = next((r["clattn"][dev] for r in rows if dev in r["clattn"]), None)
            if r0:
                print("  clattn-%s: %s (driver %s)" % (dev, r0["device"], r0["driver"]))
    print()
    head = ["T", "GFLOP"]
    for dev_cl in dev_cls:
        head += ["clattn-%s dev ms" % dev_cl, "core ms", "host ms"]
    if "ref" in devices:
        head += ["clattn-ref ms"]
    head += ["torch MHA ms"] + (["torch SDPA ms"] if have_sdpa else [])
    for dev_cl in dev_cls:
        head += ["%s/torch (host)" % dev_cl, "%s/torch (dev)" % dev_cl]
    if "ref" in devices:
        head += ["ref/torch"]
    head += ["others"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---:" for _ in head) + "|")
    for r in rows:
        t = r["torch"]["mha"]["median_ms"]
        cells = [str(r["T"]), "%.3f" % (r["flops"] / 1e9)]
        for dev_cl in dev_cls:
            c = r["clattn"].get(dev_cl)
            cells += [fmt(c and c["median_ms"]), fmt(c and c.get("core_ms")), fmt(c and c["host_median_ms"])]
        if "ref" in devices:
            c = r["clattn"].get("ref")
            cells += [fmt(c and c["host_median_ms"]) if c else "skipped"]
        cells += [fmt(t)] + ([fmt(r["torch"]["sdpa"]["median_ms"])] if have_sdpa else [])
        for dev_cl in dev_cls:
            c = r["clattn"].get(dev_cl)
            cells += [fmt(ratio(c and c["host_median_ms"], t)), fmt(ratio(c and c["median_ms"], t))]
        if "ref" in devices:
            c = r["clattn"].get("ref")
            cells += [fmt(ratio(c and c["host_median_ms"], t), "%.1f")]
        worst = [f for f in r["others"].values() if f is not None]
        cells += ["%.0f%%" % (100 * max(worst)) if worst else "-"]
        print("| " + " | ".join(cells) + " |")
    print("others: the largest share of the CPUs that other processes used during any of the row's measurements")
    print()
    # GFLOP/s
    ghead = ["T"]
    for dev_cl in dev_cls:
        ghead += ["clattn-%s dev" % dev_cl, "core", "host"]
    if dev_cls:
        ghead += ["CLBlast SGEMM (same FLOPs)"]
    if "ref" in devices:
        ghead += ["clattn-ref"]
    ghead += ["torch MHA"] + (["torch SDPA"] if have_sdpa else []) + ["torch matmul (same FLOPs)"]
    print("GFLOP/s (ratios above: clattn time / torch MHA time, lower is better)")
    print("| " + " | ".join(ghead) + " |")
    print("|" + "|".join("---:" for _ in ghead) + "|")
    for r in rows:
        f = r["flops"]
        cells = [str(r["T"])]
        for dev_cl in dev_cls:
            c = r["clattn"].get(dev_cl)
            cells += [fmt(c and c["gflops"]), fmt(c and c.get("core_gflops")),
                      fmt(c and f / (c["host_median_ms"] * 1e6))]
        if dev_cls:
            c = r["clattn"].get(dev_cls[0])
            cells += [fmt(c and c["sgemm_gflops"])]
        if "ref" in devices:
            c = r["clattn"].get("ref")
            cells += [fmt(c and c["gflops"])]
        cells += [fmt(f / (r["torch"]["mha"]["median_ms"] * 1e6))]
        if have_sdpa:
            cells += [fmt(f / (r["torch"]["sdpa"]["median_ms"] * 1e6))]
        cells += [fmt(r["torch"]["matmul"]["gflops"])]
        print("| " + " | ".join(cells) + " |")
    # the projections alone: clattn's (from its stage times) against torch's F.linear on the same shapes
    if dev_cls:
        print()
        print("projections (QKV + out, biases included): GFLOP/s")
        phead = ["T"]
        for dev_cl in dev_cls:
            phead += ["clattn-%s" % dev_cl, "GEMM core"]
        phead += ["torch F.linear (same shapes)", "torch matmul (same shapes, no bias)"]
        phead += ["%s/torch F.linear (rate)" % d for d in dev_cls] + ["%s/torch matmul (rate)" % d for d in dev_cls]
        print("| " + " | ".join(phead) + " |")
        print("|" + "|".join("---:" for _ in phead) + "|")
        for r in rows:
            tp, tm = r["torch"]["projections"]["gflops"], r["torch"]["projections_matmul"]["gflops"]
            cells = [str(r["T"])]
            for dev_cl in dev_cls:
                c = r["clattn"].get(dev_cl)
                cells += [fmt(c and c.get("projection_gflops")), (c and c.get("gemm")) or "-"]
            cells += [fmt(tp), fmt(tm)]
            for ref_rate in (tp, tm):
                for dev_cl in dev_cls:
                    c = r["clattn"].get(dev_cl)
                    cells += [fmt(ratio(c and c.get("projection_gflops"), ref_rate))]
            print("| " + " | ".join(cells) + " |")
    if a.json_out:
        with open(a.json_out, "a") as f:
            for r in rows:
                f.write(json.dumps({"B": B, "E": E, "H": H, "causal": bool(causal), "threads": a.threads,
                                    "torch_version": torch.__version__, **r}) + "\n")
        log("compare_torch.py: rows appended to %s" % a.json_out)
    skipped = [(r["T"], d, why) for r in rows for d, why in r["skipped"].items()]
    for T, d, why in skipped:
        print("T=%d on %s: skipped (%s)" % (T, d, why))
    if not have_sdpa:
        print("torch SDPA: not available in torch %s (F.scaled_dot_product_attention appeared in 2.0): skipped"
              % torch.__version__)

    # ---- plot
    if a.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            import matplotlib.ticker
        except ImportError:
            log("compare_torch.py: matplotlib missing (apt-get install python3-matplotlib): no plot")
            return 0
        fig, ax = plt.subplots(figsize=(8, 5))

        def series(label, fn, style="-o"):
            pts = [(r["T"], fn(r)) for r in rows]
            pts = [(x, y) for x, y in pts if y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)

        for dev in devices:
            if dev == "ref":
                series("clattn ref (host)", lambda r: r["clattn"]["ref"]["gflops"] if "ref" in r["clattn"] else None)
            else:
                series("clattn %s (device-resident)" % dev,
                       lambda r, d=dev: r["clattn"][d]["gflops"] if d in r["clattn"] else None)
                series("clattn %s (host-to-host)" % dev,
                       lambda r, d=dev: r["flops"] / (r["clattn"][d]["host_median_ms"] * 1e6)
                       if d in r["clattn"] else None, "--o")
                series("CLBlast SGEMM, same FLOPs (%s)" % dev,
                       lambda r, d=dev: r["clattn"][d]["sgemm_gflops"] if d in r["clattn"] else None, ":")
        series("torch MultiheadAttention", lambda r: r["flops"] / (r["torch"]["mha"]["median_ms"] * 1e6), "-s")
        if have_sdpa:
            series("torch SDPA", lambda r: r["flops"] / (r["torch"]["sdpa"]["median_ms"] * 1e6), "-^")
        series("torch matmul, same FLOPs", lambda r: r["torch"]["matmul"]["gflops"], ":")
        ax.set_xscale("log", base=2)
        ax.set_xticks([r["T"] for r in rows])
        ax.set_xticklabels([str(r["T"]) for r in rows])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel("GFLOP/s (projections 2MNK + core 4BHT²d)")
        ax.set_title("attention B=%d E=%d H=%d%s, %d CPU threads" % (B, E, H, " causal" if causal else "", a.threads))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        os.makedirs(os.path.dirname(os.path.abspath(a.plot)), exist_ok=True)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)
        log("compare_torch.py: plot written to %s" % a.plot)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        sys.exit("compare_torch.py: %s" % e)
