"""Diagnose the GDN model-level fla mismatch: contiguity of q/k/v, decode path, per-layer error."""
import math, sys, time
import torch
sys.path.insert(0, "tests/model")
from trtllm_dasc.model.recurrence import fla as F, naive as N
from test_fla_gpu import _model, rms_rel_err, _inputs

torch.manual_seed(0)
for kind, H, HV, K, V in (("gdn", 2, 4, 64, 64), ("kda", 4, 4, 64, 64)):
    q, k, v, g, beta, h0, cu = _inputs(kind, [300, 200], H, HV, K, V, torch.float32)
    T = q.shape[1]
    big = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], -1)
    qs, ks, vs = torch.split(big, [H * K, H * K, HV * V], -1)
    qn, kn, vn = qs.reshape(1, T, H, K), ks.reshape(1, T, H, K), vs.reshape(1, T, HV, V)
    print(kind, "contiguous?", qn.is_contiguous(), kn.is_contiguous(), vn.is_contiguous(), flush=True)
    o1, h1 = getattr(F, kind)(q, k, v, g, beta, h0, cu)
    o2, h2 = getattr(F, kind)(qn, kn, vn, g, beta, h0, cu)
    ro, rh = getattr(N, kind)(q, k, v, g, beta, h0, cu)
    print(kind, "fla contiguous vs ref", rms_rel_err(o1, ro), rms_rel_err(h1, rh))
    print(kind, "fla strided    vs ref", rms_rel_err(o2, ro), rms_rel_err(h2, rh), flush=True)

from trtllm_dasc.model import SeqInput
for arch in ("gdn", "kda"):
    for dtype in ("float32", "bfloat16"):
        t0 = time.time()
        ids = torch.randint(0, 1000, (300,), generator=torch.Generator().manual_seed(0))
        outs = {}
        for backend in ("fla", "torch"):
            m = _model(arch, backend, dtype)
            st, kv = m.new_state(2), m.new_kv_cache(64, 16)
            outs[backend] = m.forward([SeqInput(ids, 1)], st, kv).logits
        print(arch, dtype, "model prefill logits err", rms_rel_err(outs["fla"], outs["torch"]),
              "%.1fs" % (time.time() - t0), flush=True)
