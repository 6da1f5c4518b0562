import ctypes, statistics, sys
import torch
sys.path.insert(0, "kernels/rs8/python")
import rs8_op
lib = rs8_op.open_library(sys.argv[1])
ctx = int(sys.argv[2])
host = (ctypes.c_longlong * 256)()
rows, k = 6, 512
seq = torch.full((rows, 1), ctx, dtype=torch.int32, device="cuda")
out = torch.empty((rows, k), dtype=torch.int32, device="cuda")
mid, end, cnt, blk = ([[] for _ in range(16)] for _ in range(4))
for call in range(35):
    x = torch.randn(rows, ctx, device="cuda")
    rs8_op.launch(x, 1, seq, out, rows, ctx, 1, k, lib=lib)
    torch.cuda.synchronize()
    lib.rs8_read_clocks(ctypes.addressof(host))
    if call < 5:
        continue
    t0 = host[0 * 16 + 10]
    for w in range(16):
        st = host[w * 16 + 10]
        mid[w].append(host[w * 16 + 12] - st)
        end[w].append(host[w * 16 + 11] - st)
        cnt[w].append(host[w * 16 + 13] - st)
        blk[w].append(st - t0)
for name, a in (("start vs warp0", blk), ("compare+shfl", mid), ("sort end", end), ("counts seen", cnt)):
    print(f"{name:15s}", " ".join(f"{int(statistics.median(v)):6d}" for v in a))
