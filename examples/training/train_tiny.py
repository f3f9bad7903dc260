"""Train a tiny attention model with clattn doing the attention (forward and backward) on an OpenCL device, next
to the same model on PyTorch's own nn.MultiheadAttention, from the same initial weights: the losses fall the same
way, step by step.

    /usr/bin/python3 examples/training/train_tiny.py [--device opencl] [--steps 20]

The task: predict, at each position of a random sequence, the mean of the tokens up to it (a causal running mean:
attention can learn it). Model: x -> MultiheadAttention(causal) -> Linear. Needs torch and the clattn package
(pip install ./python).
"""
import argparse

import torch

import clattn.autograd


def model(mha: torch.nn.Module, head: torch.nn.Linear, x: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
    out, _ = mha(x, x, x, attn_mask=causal, need_weights=False)
    return head(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="a clattn device spec (default: the first OpenCL device)")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    torch.manual_seed(0)
    B, T, E, H = 8, 16, 32, 4
    ref_mha = torch.nn.MultiheadAttention(E, H, batch_first=True)
    ref_head = torch.nn.Linear(E, E)
    cl_mha = clattn.autograd.MultiheadAttention(E, H, batch_first=True, device=a.device)
    cl_mha.load_state_dict(ref_mha.state_dict())
    cl_head = torch.nn.Linear(E, E)
    cl_head.load_state_dict(ref_head.state_dict())
    opt_ref = torch.optim.Adam(list(ref_mha.parameters()) + list(ref_head.parameters()), lr=3e-3)
    opt_cl = torch.optim.Adam(list(cl_mha.parameters()) + list(cl_head.parameters()), lr=3e-3)
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    print(f"{'step':>4}  {'torch loss':>12}  {'clattn loss':>12}  (clattn on {cl_mha.clattn_device or 'default'})")
    for step in range(a.steps):
        x = torch.randn(B, T, E)
        target = x.cumsum(dim=1) / torch.arange(1, T + 1).view(1, T, 1)
        losses = []
        for mha, head, opt in ((ref_mha, ref_head, opt_ref), (cl_mha, cl_head, opt_cl)):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(mha, head, x, causal), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        print(f"{step:>4}  {losses[0]:>12.6f}  {losses[1]:>12.6f}")


if __name__ == "__main__":
    main()
