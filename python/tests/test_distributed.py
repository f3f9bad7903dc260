"""clattn.distributed against one device: 2 and 4 processes of a Gloo group (torch.multiprocessing, this machine), each
running clattn on its own OpenCL device (PoCL here), outputs and gradients equal to attend() on the whole sequence."""
import datetime
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import clattn  # noqa: E402
import clattn.distributed as CD  # noqa: E402
import clattn.functional as CF  # noqa: E402

FWD = dict(rtol=1e-4, atol=1e-5)
GRAD = dict(rtol=1e-3, atol=1e-5)

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with Gloo is not available")


def _device():
    try:
        CF.device_name("opencl")
        return "opencl"
    except clattn.Error:
        return "ref"


# (name, function, options): the whole-sequence problem is (B=2, L=S=8N, H, E=8, Ev=6)
CASES = [
    ("ring", dict(causal=False), 4, 2),
    ("ring", dict(causal=True), 4, 2),
    ("ring", dict(causal=True, layout="zigzag", merge_dtype=torch.float64), 4, 1),
    ("ring", dict(causal=False, layout="zigzag"), 2, 2),
    ("ulysses", dict(causal=True, window=5), 4, 4),
    ("ulysses", dict(causal=False), 8, 4),
    # key padding (see _padding): "tail" hides a few keys; "head" the first half and two more of batch entry 0's keys
    # (with causal, its first rows see no key: zeros, and -inf lse in the merge) and every key of entry 1
    ("ring", dict(causal=False, kpm="tail"), 4, 2),
    ("ring", dict(causal=True, layout="zigzag", kpm="head"), 4, 2),
    ("ring", dict(causal=True, kpm="head"), 2, 1),
    ("ulysses", dict(causal=True, window=5, kpm="tail"), 4, 4),
    ("ulysses", dict(causal=False, kpm="head"), 4, 4),
]


def _padding(kind: str, L: int, g) -> torch.Tensor:
    """A (2, L) key padding mask, True = padding."""
    kpm = torch.zeros(2, L, dtype=torch.bool)
    if kind == "tail":
        kpm[0, L - 3:] = True
        kpm[1] = torch.rand(L, generator=g) < 0.3
        kpm[1, 0] = False
    else:
        kpm[0, :L // 2 + 2] = True  # (uneven: no two ranks hold the same part, under either layout)
        kpm[1] = True
    return kpm


def _one(rank, world, name, opts, H, Hk, device, seed):
    g = torch.Generator().manual_seed(seed)
    L = 8 * world
    q = torch.randn(2, L, H, 8, generator=g)
    k, v = torch.randn(2, L, Hk, 8, generator=g), torch.randn(2, L, Hk, 6, generator=g)
    gout = torch.randn(2, L, H, 6, generator=g)
    causal, window = opts.get("causal", False), opts.get("window", 0)
    opts = dict(opts)
    kind = opts.pop("kpm", None)
    kpm = None if kind is None else _padding(kind, L, g)
    # one device, the whole sequence
    fq, fk, fv = (t.clone().requires_grad_(True) for t in (q, k, v))
    want = CF.attend(fq, fk, fv, None if kpm is None else ~kpm[:, None, None, :], causal=causal, window=window,
                     device=device)
    want.backward(gout)
    layout = opts.get("layout", "contiguous")
    lq, lk, lv = (CD.shard(t, layout=layout).requires_grad_(True) for t in (q, k, v))
    if kpm is not None:
        opts["key_padding_mask"] = CD.shard(kpm, layout=layout)
    if name == "ring":
        out = CD.ring_attention(lq, lk, lv, device=device, **opts)
    else:
        out = CD.ulysses_attention(lq, lk, lv, device=device, **opts)
    out.backward(CD.shard(gout, layout=layout))
    what = f"rank {rank} of {world}, {name} {opts.get('causal')} {layout} padding {kind}"
    torch.testing.assert_close(out, CD.shard(want.detach(), layout=layout), **FWD, msg=lambda m: f"{what}: {m}")
    for n, got, full in (("q", lq, fq), ("k", lk, fk), ("v", lv, fv)):
        torch.testing.assert_close(got.grad, CD.shard(full.grad, layout=layout), **GRAD,
                                   msg=lambda m: f"{what} grad {n}: {m}")
    # the whole output back on every rank
    torch.testing.assert_close(CD.unshard(out.detach(), layout=layout), want.detach(), **FWD)


def _module(rank, world, method, layout, device):
    """clattn.distributed.MultiheadAttention against torch's module on the whole sequence: each rank's output rows,
    its rows' input gradients, and the parameters' gradients summed over the group"""
    torch.manual_seed(3)
    E, H, L = 16, 4, 4 * world
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True)
    mha = CD.MultiheadAttention(E, H, method=method, layout=layout, device=device)
    mha.load_state_dict(ref.state_dict())
    x = torch.randn(2, L, E, requires_grad=True)
    gout = torch.randn(2, L, E)
    kpm = torch.zeros(2, L, dtype=torch.bool)
    kpm[1, L - 3:] = True  # (no row without a key: torch's module gives NaN there, clattn zeros)
    want, _ = ref(x, x, x, attn_mask=torch.triu(torch.ones(L, L, dtype=torch.bool), 1), key_padding_mask=kpm,
                  need_weights=False)
    want.backward(gout)
    lx = CD.shard(x.detach(), layout=layout).requires_grad_(True)
    out, none = mha(lx, key_padding_mask=CD.shard(kpm, layout=layout), is_causal=True)
    assert none is None
    out.backward(CD.shard(gout, layout=layout))
    what = f"rank {rank} of {world}, MultiheadAttention {method}"
    torch.testing.assert_close(out, CD.shard(want.detach(), layout=layout), **FWD, msg=lambda m: f"{what}: {m}")
    torch.testing.assert_close(lx.grad, CD.shard(x.grad, layout=layout), **GRAD, msg=lambda m: f"{what} x: {m}")
    for (n, p), (_, r) in zip(mha.named_parameters(), ref.named_parameters()):
        dist.all_reduce(p.grad)
        torch.testing.assert_close(p.grad, r.grad, **GRAD, msg=lambda m: f"{what} {n}: {m}")
    with pytest.raises(clattn.UnsupportedError, match="self-attention only"):
        mha(lx, lx.detach().clone())


def _worker(rank, world, rdv, device):
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        for i, (name, opts, H, Hk) in enumerate(CASES):
            _one(rank, world, name, opts, H, Hk, device, 100 + i)
        # the merge is deterministic: the same bits in a second run
        torch.manual_seed(0)
        q, k, v = (CD.shard(torch.randn(1, 8 * world, 2, 8)) for _ in range(3))
        a = CD.ring_attention(q, k, v, causal=True, device=device)
        b = CD.ring_attention(q, k, v, causal=True, device=device)
        assert torch.equal(a, b)
        # a rank that calls it otherwise: every rank raises, naming it (no hang)
        e = 8 if rank == 0 else 4
        x = torch.randn(1, 8, 2, e)
        for fn in (CD.ring_attention, CD.ulysses_attention):
            with pytest.raises(clattn.ShapeMismatchError, match="rank 1 has head size = 4, rank 0 8"):
                fn(x, x, x, device=device)
        # a rank whose arguments no rank could take: it raises its own error, every other rank names it
        bad = torch.randn(8, 2, 8) if rank == 1 else x
        with pytest.raises(clattn.ShapeMismatchError if rank == 1 else clattn.InvalidArgumentError,
                           match="query .*batch, length" if rank == 1 else "rank 1 refused its arguments"):
            CD.ring_attention(bad, x, x, device=device)
        # gradients wanted on some ranks only (their backward would wait for the others')
        y = torch.randn(1, 8, 2, 8).requires_grad_(rank == 0)
        with pytest.raises(clattn.ShapeMismatchError, match="gradients wanted"):
            CD.ulysses_attention(y, y, y, device=device)
        with pytest.raises(clattn.ShapeMismatchError, match="must divide by the group's"):
            CD.ulysses_attention(*(torch.randn(1, 8, 3, 8) for _ in range(3)), device=device)
        # a key padding mask on some ranks only, or not bool, or not the rank's keys' shape
        z = torch.randn(1, 8, 2, 8)
        with pytest.raises(clattn.ShapeMismatchError, match="rank 1 has key padding mask = 0, rank 0 1"):
            CD.ring_attention(z, z, z, key_padding_mask=torch.zeros(1, 8, dtype=torch.bool) if rank == 0 else None,
                              device=device)
        for m, err, msg in ((torch.zeros(1, 8), clattn.InvalidArgumentError, "a bool tensor"),
                            (torch.zeros(1, 8, dtype=torch.bool, device="meta"), clattn.InvalidArgumentError,
                             "on meta; CPU tensors only"),
                            (torch.zeros(1, 7, dtype=torch.bool), clattn.ShapeMismatchError, "this rank's key rows")):
            with pytest.raises(err, match=msg):
                CD.ulysses_attention(z, z, z, key_padding_mask=m, device=device)
        with pytest.raises(clattn.UnsupportedError, match="float32 only"):
            CD.ring_attention(*(torch.randn(1, 8, 2, 8).double() for _ in range(3)), device=device)
        with pytest.raises(clattn.ShapeMismatchError, match="does not split"):
            CD.shard(torch.randn(1, 7, 2, 8), layout="zigzag")
        for method, layout in (("ring", "zigzag"), ("ulysses", "contiguous")):
            _module(rank, world, method, layout, device)
        if world == 4:  # a group of ranks 1 and 3 (group ranks 0 and 1): the ring's sends go to their global ranks
            sub = dist.new_group([1, 3])
            if rank in (1, 3):
                g = torch.Generator().manual_seed(7)
                q, k, v = (torch.randn(1, 12, 2, 8, generator=g) for _ in range(3))
                want = CF.attend(q, k, v, causal=True, device=device)
                lq, lk, lv = (CD.shard(t, group=sub, layout="zigzag") for t in (q, k, v))
                out = CD.ring_attention(lq, lk, lv, group=sub, causal=True, layout="zigzag", device=device)
                torch.testing.assert_close(CD.unshard(out, group=sub, layout="zigzag"), want, **FWD)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_ring_and_ulysses_equal_one_device(world):
    device = _device()
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(world, os.path.join(d, "rendezvous"), device), nprocs=world, join=True)


def test_refused_without_a_group():
    x = torch.randn(1, 4, 2, 8)
    with pytest.raises(clattn.InvalidArgumentError, match="not initialised"):
        CD.ring_attention(x, x, x)
