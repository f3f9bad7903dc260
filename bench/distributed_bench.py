"""Ring attention on N processes against one device: the same sequence, the same total work.

    /usr/bin/python3 bench/distributed_bench.py [--ranks 2] [--T 8192] [--heads 8] [--head-dim 64] [--causal]
        [--backward] [--repeat 3] [--threads-per-rank 1] [--json FILE]

One process runs clattn.functional.attend on the whole sequence (B = 1); then N processes of a Gloo group
(torch.multiprocessing) run clattn.distributed.ring_attention on their shards (zigzag under --causal), each timing
its calls between barriers (a call's time: the slowest rank's). Rounds alternate one device and the ring; medians.
On a CPU the ranks share its cores: --threads-per-rank sets POCL_MAX_PTHREAD_COUNT for each rank (PoCL's threads),
so that N ranks of 1 thread compare with one process of N threads on N cores; the ratio then measures what the ring
adds (the block launches, the merge, the messages, imbalance), not a speed-up. Prints one JSON line per
measurement (and appends them to --json).
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def inputs(a):
    g = torch.Generator().manual_seed(0)
    shape = (1, a.T, a.heads, a.head_dim)
    return [torch.randn(shape, generator=g) for _ in range(3)] + [torch.randn(shape, generator=g)]


def one_device(a) -> float:
    import clattn.functional as CF
    q, k, v, gout = inputs(a)
    if a.backward:
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    t0 = time.perf_counter()
    out = CF.attend(q, k, v, causal=a.causal)
    if a.backward:
        out.backward(gout)
    return time.perf_counter() - t0


def ring_worker(rank, a, rdv, results):
    if a.threads_per_rank:
        os.environ["POCL_MAX_PTHREAD_COUNT"] = str(a.threads_per_rank)
    import clattn.distributed as CD
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=a.ranks,
                            timeout=datetime.timedelta(seconds=600))
    layout = "zigzag" if a.causal else "contiguous"
    q, k, v, gout = (CD.shard(t, layout=layout) for t in inputs(a))
    if a.backward:
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    times = []
    for i in range(a.repeat + 1):  # the first call compiles and is not counted
        dist.barrier()
        t0 = time.perf_counter()
        out = CD.ring_attention(q, k, v, causal=a.causal, layout=layout)
        if a.backward:
            out.backward(gout)
        dist.barrier()
        if i:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        results.put(times)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--backward", action="store_true", help="time forward and backward")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads-per-rank", type=int, default=1, help="POCL_MAX_PTHREAD_COUNT per rank (0: unset)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    one_device(a)  # compile
    ones, rings = [], []
    ctx = mp.get_context("spawn")
    for _ in range(a.repeat):  # alternating: one device, then the ring (its own warm-up call each time)
        ones.append(one_device(a))
        q = ctx.SimpleQueue()
        with tempfile.TemporaryDirectory() as d:
            mp.spawn(ring_worker, args=(a, os.path.join(d, "rdv"), q), nprocs=a.ranks, join=True)
        rings.extend(q.get())
    flops = 4.0 * a.T * a.T * a.heads * a.head_dim * (0.5 if a.causal else 1.0) * (3.5 if a.backward else 1.0)
    row = {"bench": "distributed", "ranks": a.ranks, "T": a.T, "H": a.heads, "d": a.head_dim, "causal": a.causal,
           "backward": a.backward, "threads_per_rank": a.threads_per_rank,
           "one_device_ms": round(1e3 * statistics.median(ones), 1),
           "ring_ms": round(1e3 * statistics.median(rings), 1),
           "ratio": round(statistics.median(rings) / statistics.median(ones), 3),
           "one_device_gflops": round(flops / statistics.median(ones) / 1e9, 1),
           "cpu_threads": torch.get_num_threads(), "python": sys.version.split()[0], "torch": torch.__version__}
    print(json.dumps(row))
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
