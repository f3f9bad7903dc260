"""A Hugging Face transformers model generating text with clattn's attention (attn_implementation="clattn"),
next to the same model with transformers' own "sdpa": the same tokens, and the time each took.

    python examples/transformers/generate.py [--device opencl] [--layers 2] [--prompt 64] [--new 16] [--device-cache]

--device-cache: clattn's DeviceCache holds the keys and values on the clattn device (only each step's new tokens
move there), instead of transformers' own cache.

The model is a small Llama built offline from a config with random weights (hidden 256, 8 heads, 2 key/value heads):
no download. For a real one, pass attn_implementation=clattn.transformers.register() to from_pretrained. Needs torch
and transformers (bash scripts/torch2-venv.sh makes a venv with both)."""
import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import clattn.transformers


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="clattn device spec (default: the first OpenCL device, else ref)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    ap.add_argument("--new", type=int, default=16, help="tokens to generate")
    ap.add_argument("--device-cache", action="store_true", help="keep K and V on the clattn device (DeviceCache)")
    args = ap.parse_args()

    name = clattn.transformers.register(device=args.device)  # "clattn"
    cfg = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=args.layers,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt))
    tokens = {}
    for impl in ("sdpa", name):
        model.set_attn_implementation(impl)
        opts = dict(max_new_tokens=args.new, do_sample=False, pad_token_id=0)
        cache = None
        if impl == name and args.device_cache:
            cache = clattn.transformers.DeviceCache(cfg, max_cache_len=args.prompt + args.new, device=args.device)
            opts[clattn.transformers.cache_argument(model)] = cache
        start = time.perf_counter()
        tokens[impl] = model.generate(prompt, **opts)
        moved = f", {cache.bytes_moved} bytes to and from the device, the prompt's included" if cache else ""
        print(f"{impl:>6}: {args.new} tokens in {time.perf_counter() - start:.2f} s{moved}")
    same = torch.equal(tokens["sdpa"], tokens[name])
    print("the same tokens" if same else "the tokens differ", tokens[name][0, args.prompt:].tolist())
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
