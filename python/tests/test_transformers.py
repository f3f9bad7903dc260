"""pytest: Hugging Face transformers models running clattn's attention (clattn.transformers.register(),
attn_implementation="clattn") against the same models with attn_implementation="eager": tiny random-weight models
built offline from configs (hidden 64, 4 heads, 2 key/value heads where the family has them, 2 layers) of Llama,
Mistral with a sliding window shorter than the inputs, Qwen2, GPT-2 and BERT. Logits (BERT: hidden states) with
left and right padding, greedy generate() for 16 tokens, one training step's gradients; the keywords clattn cannot
compute refused by name. Needs transformers (scripts/ci-torch2.sh makes a venv with it); skipped without."""
import math

import pytest

import clattn

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import clattn.functional as CF  # noqa: E402
import clattn.transformers as CT  # noqa: E402

DEVICE = "opencl" if len(clattn.devices()) > 1 else "ref"
NAME = CT.register("clattn_test", device=DEVICE)
FWD = dict(rtol=1e-4, atol=2e-5)
GRAD = dict(rtol=1e-3, atol=1e-5)
V, T = 128, 11


def config(family):
    t = transformers
    common = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=128)
    if family == "llama":
        return t.LlamaConfig(num_key_value_heads=2, attention_dropout=0.0, **common), t.LlamaForCausalLM
    if family == "mistral":
        return t.MistralConfig(num_key_value_heads=2, sliding_window=4, attention_dropout=0.0, **common), \
            t.MistralForCausalLM
    if family == "qwen2":
        return t.Qwen2Config(num_key_value_heads=2, attention_dropout=0.0, **common), t.Qwen2ForCausalLM
    if family == "gpt2":
        return t.GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=128, attn_pdrop=0.0,
                            resid_pdrop=0.0, embd_pdrop=0.0), t.GPT2LMHeadModel
    if family == "bert":
        return t.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common), t.BertModel
    raise ValueError(family)


DECODERS = ["llama", "mistral", "qwen2", "gpt2"]


def model_of(family, seed=0):
    cfg, cls = config(family)
    cfg.pad_token_id = 0
    torch.manual_seed(seed)
    return cls(cfg).eval()


def batch(side, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (3, T), generator=g)
    mask = torch.ones(3, T, dtype=torch.long)
    if side == "left":
        mask[0, :4], mask[2, :1] = 0, 0
    elif side == "right":
        mask[0, -4:], mask[2, -1:] = 0, 0
    ids[mask == 0] = 0
    return ids, mask


@pytest.fixture
def calls(monkeypatch):
    """How many times clattn's attention ran (a model that silently fell back would call it 0 times)."""
    n = [0]
    real = CT.attention_forward

    def counted(*a, **kw):
        n[0] += 1
        return real(*a, **kw)

    monkeypatch.setattr(CT, "attention_forward", counted)
    return n


def run(model, impl, **kw):
    model.set_attn_implementation(impl)
    out = model(**kw)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("side", ["left", "right", "none"])
@pytest.mark.parametrize("family", DECODERS + ["bert"])
def test_outputs_with_padding(family, side, calls):
    model = model_of(family)
    ids, mask = batch(side)
    with torch.no_grad():
        want = run(model, "eager", input_ids=ids, attention_mask=mask)
        got = run(model, NAME, input_ids=ids, attention_mask=mask)
    assert calls[0] == model.config.num_hidden_layers
    real = mask.bool()  # padded positions differ on purpose (a row that sees no key: 0 in clattn)
    torch.testing.assert_close(got[real], want[real], **FWD)


@pytest.mark.parametrize("family", DECODERS)
def test_generate_same_tokens(family, calls, monkeypatch):
    """Greedy generate() for 16 new tokens, left-padded batch: the same tokens as eager; clattn runs every layer of
    every step, and after the prompt its plans come one per CF.KEY_BUCKET keys, not one per token."""
    model = model_of(family, seed=2)
    ids, mask = batch("left", seed=3)
    opts = dict(max_new_tokens=16, do_sample=False, pad_token_id=0)
    model.set_attn_implementation("eager")
    want = model.generate(input_ids=ids, attention_mask=mask, **opts)
    made = []
    real = CF._create
    monkeypatch.setattr(CF, "_create", lambda dev, create, free, d, *a: made.append(d.seq_kv) or
                        real(dev, create, free, d, *a))
    model.set_attn_implementation(NAME)
    got = model.generate(input_ids=ids, attention_mask=mask, **opts)
    assert torch.equal(got, want), (got, want)
    assert calls[0] == 16 * model.config.num_hidden_layers
    assert len([s for s in made if s != T]) <= 1, made  # the decode steps (11+1 .. 11+15 keys): one bucket


@pytest.mark.parametrize("family", DECODERS + ["bert"])
def test_training_step_gradients(family, calls):
    """One training step (dropout 0) with right padding: the loss and every parameter's gradient as eager's."""
    model = model_of(family, seed=4)
    model.train()
    ids, mask = batch("right", seed=5)

    def grads(impl):
        model.zero_grad()
        model.set_attn_implementation(impl)
        if family == "bert":
            out = model(input_ids=ids, attention_mask=mask).last_hidden_state
            loss = (out[mask.bool()] ** 2).mean()
        else:
            loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    lw, gw = grads("eager")
    lg, gg = grads(NAME)
    assert calls[0] == model.config.num_hidden_layers
    assert abs(lw - lg) <= 1e-5 * abs(lw) + 1e-6
    assert gw.keys() == gg.keys()
    for n in gw:
        torch.testing.assert_close(gg[n], gw[n], **GRAD, msg=lambda m: f"{n}: {m}")


class _Module(torch.nn.Module):
    is_causal = True


@pytest.mark.parametrize("kw", ["softcap"])
def test_keywords_refused_by_name(kw):
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    with pytest.raises(clattn.UnsupportedError, match=kw):
        CT.attention_forward(_Module(), q, k, k, None, **{kw: 30.0})
    out, w = CT.attention_forward(_Module(), q, k, k, None, **{kw: None})  # None: the model does not use it
    assert w is None and out.shape == (1, 3, 4, 8)
    with pytest.raises(clattn.UnsupportedError, match="output_attentions"):
        CT.attention_forward(_Module(), q, k, k, None, output_attentions=True)


@pytest.mark.parametrize("kw", ["s_aux", "sinks"])
def test_sinks_as_gpt_oss_passes_them(kw):
    """gpt-oss's s_aux (its module's sinks parameter): attend's sinks in inference, against the eager formula (the
    sink a column of the logits, dropped after the softmax), the causal mask as transformers gives it; refused by
    name when they require grad; frozen, the gradients of query, key and value"""
    g = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(2, 4, 6, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g), torch.randn(2, 2, 6, 8,
                                                                                                       generator=g)
    s_aux = torch.nn.Parameter(torch.tensor([0.5, -math.inf, 2.0, -1.0]))
    with torch.no_grad():
        out, w = CT.attention_forward(_Module(), q, k, v, None, scaling=0.3, **{kw: s_aux})
        kk, vv = k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1)
        s = (q.double() @ kk.transpose(-1, -2) * 0.3).masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), -math.inf)
        s = torch.cat([s, s_aux.double().view(1, 4, 1, 1).expand(2, 4, 6, 1)], -1)
        want = (torch.softmax(s, -1)[..., :-1] @ vv).transpose(1, 2)
    assert w is None
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(clattn.UnsupportedError, match=f"{kw}= \\(attention sinks\\) that require grad"):
        CT.attention_forward(_Module(), q, k, v, None, **{kw: s_aux})  # (s_aux a parameter: it requires grad)
    # frozen (a fine-tuning's): query, key and value's gradients through the sinks' softmax
    s_aux.requires_grad_(False)
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    out, _ = CT.attention_forward(_Module(), q, k, v, None, scaling=0.3, **{kw: s_aux})
    kk, vv = k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1)
    s = (q.double() @ kk.transpose(-1, -2) * 0.3).masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), -math.inf)
    s = torch.cat([s, s_aux.double().view(1, 4, 1, 1).expand(2, 4, 6, 1)], -1)
    want = (torch.softmax(s, -1)[..., :-1] @ vv).transpose(1, 2)
    gout = torch.randn(out.shape, generator=g)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), gout), torch.autograd.grad(want, (q, k, v), gout.double())):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-3, atol=1e-5)


def test_sliding_window_and_position_bias():
    """The window from the call when there is no mask (causal), and a T5-style position_bias as a float mask, against
    torch's formula in float64."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 4, 9, 8, generator=g) for _ in range(3))
    out, _ = CT.attention_forward(_Module(), q, k[:, :2], v[:, :2], None, sliding_window=3, scaling=0.5)
    i = torch.arange(9)
    hide = (i[None, :] > i[:, None]) | (i[:, None] - i[None, :] >= 3)
    kk, vv = k[:, :2].repeat_interleave(2, 1).double(), v[:, :2].repeat_interleave(2, 1).double()
    want = torch.softmax((q.double() @ kk.transpose(-1, -2) * 0.5).masked_fill(hide, float("-inf")), -1) @ vv
    torch.testing.assert_close(out.double(), want.transpose(1, 2), **FWD)
    bias = torch.randn(1, 4, 9, 9, generator=g)
    m = torch.rand(2, 1, 9, 9, generator=g) > 0.2
    m[..., 0] = True
    out, _ = CT.attention_forward(_Module(), q, k, v, m, position_bias=bias)
    s = (q.double() @ k.double().transpose(-1, -2) / 8 ** 0.5 + bias.double()).masked_fill(~m, float("-inf"))
    torch.testing.assert_close(out.double(), (torch.softmax(s, -1) @ v.double()).transpose(1, 2), **FWD)


# ---------------------------------------------------------------- DeviceCache: K and V stay on the clattn device

def generate(model, ids, mask, cache=None, new=16):
    opts = dict(max_new_tokens=new, do_sample=False, pad_token_id=0)
    if cache is not None:  # cache= in newer transformers, past_key_values= before (4.x, 5.x up to at least 5.17)
        opts[CT.cache_argument(model)] = cache
    return model.generate(input_ids=ids, attention_mask=mask, **opts)


@pytest.mark.parametrize("side", ["left", "none"])
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_device_cache_generates_the_same_tokens(family, side, calls):
    """Greedy generate() with the DeviceCache: the same tokens as eager with its own cache (left padding not stored,
    Mistral's window of 4 over 27 tokens), clattn's attention in every layer of every step."""
    model = model_of(family, seed=7)
    ids, mask = batch(side, seed=8)
    model.set_attn_implementation("eager")
    want = generate(model, ids, mask)
    model.set_attn_implementation(NAME)
    cache = CT.DeviceCache(model.config, max_cache_len=32, device=DEVICE)
    got = generate(model, ids, mask, cache)
    assert torch.equal(got, want), (got, want)
    assert calls[0] == 16 * model.config.num_hidden_layers
    assert cache.get_seq_length() == T + 15  # transformers' positions: the padding counts there


def test_device_cache_moves_only_the_new_tokens():
    """The bytes a decode step moves to and from the device do not depend on the context: per step, each layer's
    new Q, K, V and its output (B x (H*dk + 2*HK*dk + H*dv) floats), for prompts of 11 and 40 tokens."""
    model = model_of("llama", seed=9)
    model.set_attn_implementation(NAME)
    per_step = []
    for length in (11, 40):
        ids = torch.randint(1, V, (2, length), generator=torch.Generator().manual_seed(length))
        mask = torch.ones_like(ids)
        moved = []
        for new in (1, 6):
            cache = CT.DeviceCache(model.config, max_cache_len=64, device=DEVICE)
            generate(model, ids, mask, cache, new=new)
            moved.append(cache.bytes_moved)
        per_step.append((moved[1] - moved[0]) / 5)
    B, H, HK, d = 2, 4, 2, 16
    assert per_step == [4 * B * (H * d + 2 * HK * d + H * d) * model.config.num_hidden_layers] * 2, per_step


def test_device_cache_refusals():
    model = model_of("llama", seed=10)
    model.set_attn_implementation(NAME)
    ids, mask = batch("right", seed=11)  # right padding: keys hidden after real ones
    with pytest.raises(clattn.UnsupportedError, match="left-padded causal"):
        generate(model, ids, mask, CT.DeviceCache(model.config, max_cache_len=32, device=DEVICE), new=2)
    ids, mask = batch("none", seed=12)
    with pytest.raises(clattn.Error, match="capacity"):  # 11 + 4 tokens in a cache of 12
        generate(model, ids, mask, CT.DeviceCache(model.config, max_cache_len=12, device=DEVICE), new=5)
    model.set_attn_implementation("eager")  # a model whose calls do not reach clattn
    with pytest.raises(clattn.UnsupportedError, match="update\\(\\) twice"):
        generate(model, ids, mask, CT.DeviceCache(model.config, max_cache_len=32, device=DEVICE), new=2)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_device_cache_half_models(dt):
    """A float16 or bfloat16 model's steps run on decode plans of its type: each step moves 2-byte elements (half the
    float32 bytes), the cache stores the model's type (CLATTN_KV_HALF, CLATTN_KV_BF16), and the logits of a prompt and of a step agree with the same
    model on clattn's attention with transformers' own cache (the functional path, also in the model's type) to the
    type's precision."""
    model = model_of("llama", seed=13).to(dt)
    model.set_attn_implementation(NAME)
    ids, mask = batch("left", seed=14)
    cache = CT.DeviceCache(model.config, max_cache_len=32, device=DEVICE)
    kw = CT.cache_argument(model)
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask, use_cache=True, **{kw: cache}).logits
        want = model(input_ids=ids, attention_mask=mask, use_cache=True)
        nxt = got[:, -1].argmax(-1, keepdim=True)
        mask2 = torch.cat((mask, torch.ones_like(nxt)), 1)
        moved = cache.bytes_moved
        got2 = model(input_ids=nxt, attention_mask=mask2, use_cache=True, **{kw: cache}).logits
        want2 = model(input_ids=nxt, attention_mask=mask2, **{kw: want.past_key_values}).logits
    tol = dict(rtol=2e-2, atol=2e-2) if dt == torch.bfloat16 else dict(rtol=2e-3, atol=2e-3)
    live = mask.bool()  # (padding positions' logits are not compared: the cache does not store them)
    torch.testing.assert_close(got[live].float(), want.logits[live].float(), **tol)
    torch.testing.assert_close(got2.float(), want2.float(), **tol)
    B, H, HK, d = 3, 4, 2, 16
    assert cache.bytes_moved - moved == 2 * B * (H * d + 2 * HK * d + H * d) * model.config.num_hidden_layers
    assert cache.layers[0].kv_type == (1 if dt == torch.float16 else 2)
