"""pytest: training through clattn from PyTorch (issue 43). clattn.autograd.MultiheadAttention against
torch.nn.MultiheadAttention: one training plan per shape reused across steps and optimizer updates, the forward's
statistics handed to the backward, torch's dtype rules as clattn.Attention's, unbatched (T, E) inputs, masks that
ask for a gradient refused, a second derivative refused with its reason (never a silently constant gradient), two
calls before one backward, train()/eval(), copies; and clattn.Attention's set_weights and forward_train."""
import copy
import pickle

import numpy as np
import pytest

import clattn

torch = pytest.importorskip("torch")
import clattn.autograd as ca  # noqa: E402 (needs torch)

HAVE_OPENCL = len(clattn.devices()) > 1
DEVICES = ["ref"] + (["opencl"] if HAVE_OPENCL else [])
GRAD = dict(rtol=1e-3, atol=1e-5)


def pair(E, H, device, seed=0, batch_first=True, bias=True):
    """torch's module and clattn's, with the same parameters."""
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(E, H, batch_first=batch_first, bias=bias)
    mine = ca.MultiheadAttention(E, H, batch_first=batch_first, bias=bias, device=device)
    mine.load_state_dict(ref.state_dict())
    return ref, mine


def grads_of(mod, x, target, **kw):
    """loss, x.grad and every parameter's gradient of ((mod(x) - target)^2).mean()."""
    mod.zero_grad()
    xi = x.detach().clone().requires_grad_(True)
    out, _ = mod(xi, xi, xi, need_weights=False, **kw)
    loss = ((out.float() - target) ** 2).mean()
    loss.backward()
    return loss.item(), xi.grad, {n: p.grad.clone() for n, p in mod.named_parameters()}


def assert_same_grads(a, b):
    assert abs(a[0] - b[0]) <= 1e-5 * abs(a[0]) + 1e-6, (a[0], b[0])
    torch.testing.assert_close(b[1], a[1], **GRAD)
    for n in a[2]:
        torch.testing.assert_close(b[2][n], a[2][n], **GRAD, msg=n)


@pytest.mark.parametrize("device", DEVICES)
def test_one_training_plan_per_shape_across_optimizer_steps(device):
    """Five Adam steps: the same losses and gradients as torch's, one plan made for the shape and kept (the
    parameters handed to it at each step), and a second shape a second plan."""
    B, T, E, H = 2, 7, 16, 4
    ref, mine = pair(E, H, device, seed=1)
    x, target = torch.randn(B, T, E), torch.randn(B, T, E)
    opt_r, opt_m = torch.optim.Adam(ref.parameters(), lr=0.05), torch.optim.Adam(mine.parameters(), lr=0.05)
    for _ in range(5):
        r, m = grads_of(ref, x, target), grads_of(mine, x, target)
        assert_same_grads(r, m)
        opt_r.step(), opt_m.step()
    assert mine._attn.plans_cached == 1
    grads_of(mine, torch.randn(B, T + 3, E), torch.randn(B, T + 3, E))
    assert mine._attn.plans_cached == 2


@pytest.mark.parametrize("device", DEVICES)
def test_weights_replaced_or_loaded_between_calls_are_used(device):
    """A parameter given new storage (.data =) or new values (load_state_dict) between calls: the next call uses
    them, as torch's module does."""
    B, T, E, H = 2, 5, 8, 2
    ref, mine = pair(E, H, device, seed=2)
    x, target = torch.randn(B, T, E), torch.randn(B, T, E)
    grads_of(mine, x, target)
    new = torch.randn(3 * E, E) * 0.3
    ref.in_proj_weight.data = new.clone()
    mine.in_proj_weight.data = new.clone()
    assert_same_grads(grads_of(ref, x, target), grads_of(mine, x, target))
    other, _ = pair(E, H, "ref", seed=3)
    ref.load_state_dict(other.state_dict())
    mine.load_state_dict(other.state_dict())
    assert_same_grads(grads_of(ref, x, target), grads_of(mine, x, target))


@pytest.mark.parametrize("device", DEVICES)
def test_unbatched_input_as_torch_takes_it(device):
    T, E, H = 6, 8, 2
    ref, mine = pair(E, H, device, seed=4)
    x, target = torch.randn(T, E), torch.randn(T, E)
    kpm = torch.tensor([False, False, True, False, True, False])
    r, m = grads_of(ref, x, target, key_padding_mask=kpm), grads_of(mine, x, target, key_padding_mask=kpm)
    assert m[1].shape == (T, E)
    assert_same_grads(r, m)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_first_false_and_cross_attention(device):
    Tq, Tk, B, E, H = 5, 7, 2, 8, 2
    ref, mine = pair(E, H, device, seed=5, batch_first=False)
    q, kv = torch.randn(Tq, B, E), torch.randn(Tk, B, E)
    for mod in (ref, mine):
        mod.zero_grad()
    outs = []
    for mod in (ref, mine):
        qi, kvi = q.clone().requires_grad_(True), kv.clone().requires_grad_(True)
        out, _ = mod(qi, kvi, kvi, need_weights=False)
        (out * torch.arange(out.numel()).reshape(out.shape).sin()).sum().backward()
        outs.append((out.detach(), qi.grad, kvi.grad, mod.in_proj_weight.grad.clone()))
    for a, b in zip(outs[0], outs[1]):
        torch.testing.assert_close(b, a, **GRAD)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_keep_their_dtype_and_float64_is_refused(dtype):
    """Attention's rules: half inputs widened exactly, computed in float32, the output and x's gradient rounded back
    to the input's dtype (the parameters' gradients in theirs); float64 refused, naming it."""
    B, T, E, H = 2, 5, 8, 2
    ref, mine = pair(E, H, "ref", seed=6)
    x = torch.randn(B, T, E).to(dtype)
    xi = x.clone().requires_grad_(True)
    out, _ = mine(xi, xi, xi)
    assert out.dtype == dtype
    out.float().sum().backward()
    assert xi.grad.dtype == dtype and mine.in_proj_weight.grad.dtype == torch.float32
    xr = x.float().requires_grad_(True)
    out_r, _ = ref(xr, xr, xr, need_weights=False)
    out_r.sum().backward()
    torch.testing.assert_close(out, out_r.to(dtype))
    torch.testing.assert_close(xi.grad, xr.grad.to(dtype))
    torch.testing.assert_close(mine.in_proj_weight.grad, ref.in_proj_weight.grad, **GRAD)
    x64 = torch.randn(B, T, E, dtype=torch.float64, requires_grad=True)
    with pytest.raises(clattn.InvalidArgumentError, match="float64"):
        mine(x64, x64, x64)


@pytest.mark.parametrize("device", DEVICES)
def test_masks_that_ask_for_a_gradient_are_refused(device):
    B, T, E, H = 2, 5, 8, 2
    ref, mine = pair(E, H, device, seed=7)
    x, target = torch.randn(B, T, E), torch.randn(B, T, E)
    bias = torch.randn(T, T, requires_grad=True)
    with pytest.raises(clattn.UnsupportedError, match="attn_mask requires grad"):
        mine(x, x, x, attn_mask=bias)
    # detached (not learned), a float mask is added to the scores as torch adds it
    assert_same_grads(grads_of(ref, x, target, attn_mask=bias.detach()),
                      grads_of(mine, x, target, attn_mask=bias.detach()))
    with torch.no_grad():  # no gradient asked for: accepted
        mine(x, x, x, attn_mask=bias)


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
@pytest.mark.parametrize("device", DEVICES)
def test_a_second_derivative_is_refused_not_silently_zero(device):
    """A gradient penalty (create_graph=True, then a gradient of the gradient): the first gradient requires grad
    and its own backward raises, saying what is unsupported. create_graph=True alone is accepted."""
    B, T, E, H = 2, 5, 8, 2
    _, mine = pair(E, H, device, seed=8)
    x = torch.randn(B, T, E, requires_grad=True)
    out, _ = mine(x, x, x)
    g, = torch.autograd.grad(out.square().sum(), mine.in_proj_weight, create_graph=True)
    assert g.requires_grad
    with pytest.raises(clattn.UnsupportedError, match="second derivative"):
        g.square().sum().backward()
    out, _ = mine(x, x, x)
    gx, = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(clattn.UnsupportedError, match="double backward"):
        torch.autograd.grad(gx.sum(), x)
    out, _ = mine(x, x, x)
    out.sum().backward(create_graph=True)  # no second derivative taken: fine
    assert x.grad is not None


@pytest.mark.parametrize("device", DEVICES)
def test_two_calls_before_one_backward_with_dropout(device):
    """The module called twice (two dropout seeds) before one backward: each call's backward uses its own seed and
    inputs, so the gradient is the sum of the two calls' gradients taken one at a time."""
    B, T, E, H = 2, 6, 8, 2
    torch.manual_seed(9)
    mine = ca.MultiheadAttention(E, H, dropout=0.4, batch_first=True, device=device)
    x1, x2 = torch.randn(B, T, E), torch.randn(B, T, E)
    seed0 = mine._seed

    def one(xs, seeds):
        mine.zero_grad()
        total = 0
        for xv, s in zip(xs, seeds):
            mine._seed = s - 1
            out, _ = mine(xv, xv, xv)
            total = total + (out * xv).sum()
        total.backward()
        return mine.in_proj_weight.grad.clone()

    g1 = one([x1], [seed0 + 1])
    g2 = one([x2], [seed0 + 2])
    both = one([x1, x2], [seed0 + 1, seed0 + 2])
    torch.testing.assert_close(both, g1 + g2, **GRAD)
    assert not torch.allclose(g1, one([x1], [seed0 + 5])), "another seed must drop other weights"


@pytest.mark.parametrize("device", DEVICES)
def test_eval_has_no_dropout_and_copies_make_their_own_plans(device):
    B, T, E, H = 2, 5, 8, 2
    torch.manual_seed(10)
    ref = torch.nn.MultiheadAttention(E, H, dropout=0.5, batch_first=True)
    mine = ca.MultiheadAttention(E, H, dropout=0.5, batch_first=True, device=device)
    mine.load_state_dict(ref.state_dict())
    x = torch.randn(B, T, E)
    out_train, _ = mine(x, x, x)
    ref.eval(), mine.eval()
    out_r, _ = ref(x, x, x, need_weights=False)
    out_m, _ = mine(x, x, x)
    torch.testing.assert_close(out_m, out_r, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(out_train, out_m)
    for dup in (copy.deepcopy(mine), pickle.loads(pickle.dumps(mine))):
        assert dup._attn is None
        torch.testing.assert_close(dup(x, x, x)[0], out_m)


def test_attention_set_weights_and_forward_train():
    """clattn.Attention: set_weights gives a made plan new weights (the same numbers as a new module), refuses
    another set of arrays or shapes; forward_train's lse and context, handed to backward, give its gradients."""
    rng = np.random.default_rng(11)
    B, T, E, H = 2, 6, 8, 2
    w1 = {k: rng.standard_normal((E, E)).astype(np.float32) * 0.3 for k in ("w_query", "w_key", "w_value", "w_out")}
    w2 = {k: rng.standard_normal((E, E)).astype(np.float32) * 0.3 for k in w1}
    x, dout = rng.standard_normal((B, T, E)).astype(np.float32), rng.standard_normal((B, T, E)).astype(np.float32)
    for device in DEVICES:
        a = clattn.Attention(H, **w1, device=device, causal=True)
        a(x)
        a.set_weights(**w2)
        fresh = clattn.Attention(H, **w2, device=device, causal=True)
        np.testing.assert_array_equal(a(x)[0], fresh(x)[0])
        out, lse, ctx = a.forward_train(x)
        np.testing.assert_allclose(out, fresh(x)[0], rtol=1e-5, atol=1e-6)
        assert lse.shape == (B, H, T) and ctx.shape == (B, T, E)
        g_saved, g_fresh = a.backward(x, dout, lse=lse, context=ctx), fresh.backward(x, dout)
        for k in g_fresh:
            np.testing.assert_allclose(g_saved[k], g_fresh[k], rtol=1e-4, atol=1e-5, err_msg=k)
        with pytest.raises(clattn.InvalidArgumentError, match="b_out is given"):
            a.set_weights(**w2, b_out=np.zeros(E, np.float32))
        with pytest.raises(clattn.InvalidArgumentError, match="w_out is missing"):
            a.set_weights(**{k: v for k, v in w2.items() if k != "w_out"})
        with pytest.raises(clattn.ShapeMismatchError):
            a.set_weights(**{**w2, "w_out": np.zeros((E, E + 1), np.float32)})
        with pytest.raises(clattn.InvalidArgumentError, match="give both"):
            a.backward(x, dout, lse=lse)
        np.testing.assert_array_equal(a(x)[0], fresh(x)[0])  # refusals kept the weights


def test_a_step_runs_the_forward_once_and_hands_its_statistics_to_the_backward(monkeypatch):
    """One forward per step (forward_train), whose lse and context the backward receives (so the statistics are not
    computed twice); and the statistics are used: a wrong lse gives other gradients."""
    B, T, E, H = 2, 5, 8, 2
    ref, mine = pair(E, H, "ref", seed=12)
    calls = []
    real_fwd, real_bwd = clattn.Attention.forward_train, clattn.Attention.backward

    def fwd(self, *a, **k):
        calls.append("forward_train")
        return real_fwd(self, *a, **k)

    def bwd(self, *a, **k):
        calls.append(("backward", k.get("lse") is not None and k.get("context") is not None))
        return real_bwd(self, *a, **k)

    monkeypatch.setattr(clattn.Attention, "forward_train", fwd)
    monkeypatch.setattr(clattn.Attention, "backward", bwd)
    monkeypatch.setattr(clattn.Attention, "__call__", lambda *a, **k: pytest.fail("an inference call in a step"))
    x, target = torch.randn(B, T, E), torch.randn(B, T, E)
    assert_same_grads(grads_of(ref, x, target), grads_of(mine, x, target))
    assert calls == ["forward_train", ("backward", True)], calls
    monkeypatch.undo()
    a = mine._attn
    xn, dout = x.numpy(), np.ones((B, T, E), np.float32)
    _, lse, ctx = a.forward_train(xn)
    good, bad = a.backward(xn, dout, lse=lse, context=ctx), a.backward(xn, dout, lse=lse + 1.0, context=ctx)
    assert not np.allclose(good["x"], bad["x"]), "backward ignored the lse it was given"


def rope_mha_reference(mod, x, kv, pq, pk, causal):
    """mod's output in float64, written out: torch's projections (mod's parameters as float64 leaves in mod._ref64),
    the rotation of queries and keys at pq and pk (test_functional's rope_reference), the oracle's attention, the
    output projection. x (B, L, E), kv (B, S, E)."""
    from test_functional import oracle, rope_reference
    p = mod._ref64
    H, (B, L, E), S = mod.num_heads, x.shape, kv.shape[1]
    wq, wk, wv = p["in_proj_weight"].chunk(3)
    bq, bk, bv = p["in_proj_bias"].chunk(3)
    q = (x @ wq.T + bq).view(B, L, H, E // H)
    k = (kv @ wk.T + bk).view(B, S, H, E // H)
    v = (kv @ wv.T + bv).view(B, S, H, E // H)
    o = oracle(rope_reference(q, mod.rope, pq).transpose(1, 2), rope_reference(k, mod.rope, pk).transpose(1, 2),
               v.transpose(1, 2), is_causal=causal)
    return o.transpose(1, 2).reshape(B, L, E) @ p["out_proj.weight"].T + p["out_proj.bias"]


@pytest.mark.parametrize("device", DEVICES)
def test_rope_at_position_ids(device):
    """rope= and position_ids (clattn 0.8): the module's output and every gradient (input and parameters) against the
    computation written out in float64 (rope_mha_reference), over two SGD steps whose positions differ (the plan
    reused with new positions and weights); rows at 0 .. T-1 without position_ids; the positions the backward uses
    are the forward's, even when the caller's tensor changes before it; the sequence-first layout; cross-attention's
    keys at key_position_ids; the refusals."""
    import clattn.functional as CF
    B, T, E, H = 2, 7, 16, 2
    torch.manual_seed(21)
    mod = ca.MultiheadAttention(E, H, batch_first=True, device=device, rope=CF.Rope(kind="interleaved", dims=6))
    x = torch.randn(B, T, E)
    steps = (torch.stack((torch.tensor([0, 1, 2, 0, 1, 2, 3]), torch.arange(T) * 3 + 1500)),
             torch.tensor([5, 6, 7, 8, 0, 1, 2]))
    for pos in steps:
        mod._ref64 = {n: p.detach().double().requires_grad_(True) for n, p in mod.named_parameters()}
        want = rope_mha_reference(mod, x.double(), x.double(), pos.expand(B, -1), pos.expand(B, -1), True)
        mod.zero_grad()
        xi = x.clone().requires_grad_(True)
        held = pos.clone()
        out, _ = mod(xi, xi, xi, is_causal=True, position_ids=held)
        torch.testing.assert_close(out.double(), want.detach(), rtol=1e-4, atol=1e-5)
        held[..., -1] += 100  # the backward runs at the forward's positions, not at what the tensor holds now
        dout = torch.randn(out.shape)
        out.backward(dout)
        exp = torch.autograd.grad(want, [*mod._ref64.values()], dout.double(), retain_graph=True)
        for (name, prm), e in zip(mod.named_parameters(), exp):
            torch.testing.assert_close(prm.grad.double(), e, **GRAD, msg=lambda m: f"{name}: {m}")
        x64 = x.double().requires_grad_(True)
        want_x = rope_mha_reference(mod, x64, x64, pos.expand(B, -1), pos.expand(B, -1), True)
        torch.testing.assert_close(xi.grad.double(), torch.autograd.grad(want_x, x64, dout.double())[0], **GRAD)
        with torch.no_grad():
            for prm in mod.parameters():
                prm -= 0.1 * prm.grad
    assert mod._attn.plans_cached == 1
    ar = torch.arange(T).expand(B, -1)
    mod._ref64 = {n: p.detach().double() for n, p in mod.named_parameters()}
    torch.testing.assert_close(mod(x, x, x)[0].double(), rope_mha_reference(mod, x.double(), x.double(), ar, ar, False),
                               rtol=1e-4, atol=1e-5)
    # sequence first: the positions stay (batch, length)
    seq = ca.MultiheadAttention(E, H, batch_first=False, device=device, rope=mod.rope)
    seq.load_state_dict(mod.state_dict())
    pos = steps[0]
    xt = x.transpose(0, 1)
    got, _ = seq(xt, xt, xt, position_ids=pos)
    torch.testing.assert_close(got.transpose(0, 1).double(), rope_mha_reference(mod, x.double(), x.double(), pos, pos,
                                                                                False), rtol=1e-4, atol=1e-5)
    # cross-attention: 5 keys at positions of their own, one row for every batch entry
    kv = torch.randn(B, 5, E)
    pk = torch.tensor([9, 0, 2000, 3, 4])
    got, _ = mod(x, kv, kv, position_ids=pos, key_position_ids=pk)
    torch.testing.assert_close(got.double(), rope_mha_reference(mod, x.double(), kv.double(), pos, pk.expand(B, -1),
                                                                False), rtol=1e-4, atol=1e-5)
    # a rope set on the module after its first call is the one used
    mod.rope = CF.Rope()
    got, _ = mod(x, x, x)
    torch.testing.assert_close(got.double(), rope_mha_reference(mod, x.double(), x.double(), ar, ar, False),
                               rtol=1e-4, atol=1e-5)
    plain = ca.MultiheadAttention(E, H, batch_first=True, device=device)
    with pytest.raises(clattn.InvalidArgumentError, match="position_ids without rope"):
        plain(x, x, x, position_ids=pos)
    with pytest.raises(clattn.InvalidArgumentError, match="self-attention's keys"):
        mod(x, x, x, position_ids=pos, key_position_ids=pos)
    with pytest.raises(clattn.ShapeMismatchError, match="key_position_ids is needed"):
        mod(x, kv, kv, position_ids=pos)
    with pytest.raises(clattn.InvalidArgumentError, match="rope: a str"):
        ca.MultiheadAttention(E, H, rope="half")
