"""Train train_tiny.py's model with its sequence split across N processes (context parallelism: clattn.distributed's
ring attention, each process on its own OpenCL device), next to the same model in one process on PyTorch's own
nn.MultiheadAttention, from the same initial weights: the losses fall the same way, step by step.

    /usr/bin/python3 examples/training/train_context_parallel.py [--ranks 2] [--method ring|ulysses] [--steps 20]

Each process holds its rows of every sequence (zigzag shards for the ring: the causal work balanced), runs the
projections on them, the attention core across the group, and the loss on its rows; the gradients are summed over
the group (all_reduce) before each rank's optimizer steps, so every rank keeps the same weights. Gloo on this
machine (torch.multiprocessing); CLATTN_DEVICE picks each process's device. Needs torch and the clattn package.
"""
import argparse
import datetime
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import clattn.distributed as CD

B, T, E, H = 8, 16, 32, 4


def batch(step: int):
    """The step's sequences and targets (the causal running mean), the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(B, T, E, generator=g)
    return x, x.cumsum(dim=1) / torch.arange(1, T + 1).view(1, T, 1)


def worker(rank: int, ranks: int, rdv: str, a) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=ranks,
                            timeout=datetime.timedelta(seconds=120))
    layout = "zigzag" if a.method == "ring" else "contiguous"
    torch.manual_seed(0)
    ref_mha, ref_head = torch.nn.MultiheadAttention(E, H, batch_first=True), torch.nn.Linear(E, E)
    mha = CD.MultiheadAttention(E, H, method=a.method, layout=layout, device=a.device)
    mha.load_state_dict(ref_mha.state_dict())
    head = torch.nn.Linear(E, E)
    head.load_state_dict(ref_head.state_dict())
    params = list(mha.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=3e-3)
    opt_ref = torch.optim.Adam(list(ref_mha.parameters()) + list(ref_head.parameters()), lr=3e-3)
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    worst = 0.0  # the largest relative difference of the two losses
    if rank == 0:
        print(f"{'step':>4}  {'torch, 1 process':>16}  {f'clattn, {ranks} ranks':>16}  ({a.method}, {layout})")
    for step in range(a.steps):
        x, target = batch(step)
        # this rank's rows: the loss is their share of the mean over every row
        lx, lt = CD.shard(x, layout=layout), CD.shard(target, layout=layout)
        opt.zero_grad()
        out, _ = mha(lx, is_causal=True)
        loss = torch.nn.functional.mse_loss(head(out), lt, reduction="sum") / target.numel()
        loss.backward()
        for p in params:
            dist.all_reduce(p.grad)
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:  # the same model in one process, on the whole sequences
            opt_ref.zero_grad()
            ref_out, _ = ref_mha(x, x, x, attn_mask=causal, need_weights=False)
            ref_loss = torch.nn.functional.mse_loss(ref_head(ref_out), target)
            ref_loss.backward()
            opt_ref.step()
            print(f"{step:>4}  {ref_loss.item():>16.6f}  {total.item():>16.6f}")
            worst = max(worst, abs(total.item() - ref_loss.item()) / abs(ref_loss.item()))
    dist.destroy_process_group()
    if rank == 0:
        print(f"largest relative difference of the losses: {worst:.2e}")
        if worst > 1e-4:  # (fp32 on both sides: a few ulps per step)
            raise SystemExit("the distributed losses left the one-process curve")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--method", choices=("ring", "ulysses"), default="ring")
    ap.add_argument("--device", default=None, help="a clattn device spec (default: the first OpenCL device)")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(a.ranks, os.path.join(d, "rendezvous"), a), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
