# encoder_torch.py: torch.nn.TransformerEncoderLayer at the configuration of
# `clattn-bench --encoder --ff 2048` (B=4 T=512 E=512 H=8, ReLU, post-norm, eval,
# no dropout), 2 threads, median of 10 after 2 warm-up, for bench/results/.
# Run with Debian's torch: /usr/bin/python3 bench/experiments/encoder_torch.py
import time, torch
torch.set_num_threads(2)
m = torch.nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, batch_first=True).eval()
x = torch.rand(4, 512, 512) * 2 - 1
ts = []
with torch.no_grad():
    for i in range(12):
        t = time.perf_counter(); m(x); dt = (time.perf_counter() - t) * 1e3
        if i >= 2: ts.append(dt)
ts.sort(); print("torch", torch.__version__, "TransformerEncoderLayer B=4 T=512 E=512 H=8 F=2048: median %.2f ms (min %.2f max %.2f)" % ((ts[4]+ts[5])/2, ts[0], ts[-1]))
