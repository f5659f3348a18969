#!/usr/bin/env python3
"""End-to-end demo: serialize a small GPT-like transformer with tensorizer,
load it back into an uninitialised module, and check that it computes exactly
the same thing.  Compares against torch.save / torch.load(weights_only=True).

Run from the repository root:

    .venv/bin/python demo/demo.py

Exits non-zero if the reloaded model's outputs (or weights) differ bit for bit.
No downloads; fixed seed; well under 30 s on 2 cores.
"""

import math
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

try:
    import tensorizer  # noqa: F401
except ImportError:
    # Not installed in this interpreter: use the in-tree package.
    sys.path.insert(0, os.path.join(REPO, "tz-python"))
    import tensorizer  # noqa: F401

import torch
from torch import nn
from torch.nn import functional as F

from tensorizer import TensorDeserializer, TensorSerializer
from tensorizer.utils import no_init_or_tensor

# ~23M fp32 parameters (~92 MB)
VOCAB, D, LAYERS, HEADS, CTX = 4096, 512, 6, 8, 256


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        # Non-persistent buffer: not in state_dict(), but write_module() still
        # serializes it, and load_into_module() registers it back as a
        # *persistent* buffer (see restore_non_persistent below).
        self.register_buffer(
            "mask",
            torch.tril(torch.ones(CTX, CTX, dtype=torch.bool)).view(1, 1, CTX, CTX),
            persistent=False,
        )

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // HEADS))
        att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D)
        self.attn = CausalSelfAttention()
        self.ln2 = nn.LayerNorm(D)
        self.fc = nn.Linear(D, 4 * D)
        self.out = nn.Linear(4 * D, D)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        # A persistent buffer, to check buffers round-trip too.
        self.register_buffer("logit_scale", torch.ones(()))

    def forward(self, x):
        return self.lm_head(self.ln_f(x)) * self.logit_scale


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(CTX, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = Head()

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def non_persistent_sets(model):
    return {n: set(m._non_persistent_buffers_set) for n, m in model.named_modules()}


def restore_non_persistent(model, sets):
    """load_into_module() re-registers every buffer as persistent; put the
    module's declared persistence back so state_dict() matches the original."""
    for name, m in model.named_modules():
        m._non_persistent_buffers_set.update(sets.get(name, ()))


def total_bytes(model):
    ts = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in ts)


def main():
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    print(f"tensorizer {getattr(tensorizer, '__version__', '?')} from "
          f"{os.path.dirname(tensorizer.__file__)}; torch {torch.__version__}")

    t0 = time.perf_counter()
    model = TinyGPT()
    with torch.no_grad():
        model.head.logit_scale.fill_(1.25)
    model.eval()
    nbytes = total_bytes(model)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"model: TinyGPT d={D} layers={LAYERS} vocab={VOCAB} ctx={CTX}: "
          f"{nparams / 1e6:.1f}M fp32 params, {nbytes / 1e6:.1f} MB incl. buffers "
          f"(built in {time.perf_counter() - t0:.1f}s)")

    idx = torch.randint(0, VOCAB, (2, 128), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref_out = model(idx)

    failures = []
    rows = []
    with tempfile.TemporaryDirectory(prefix="tz-demo-") as tmp:
        def best_of(fn, n=3):
            best, res = float("inf"), None
            for _ in range(n):
                t0 = time.perf_counter()
                res = fn()
                best = min(best, time.perf_counter() - t0)
            return best, res

        # ---------------- ours: write_module / load_into_module -------------
        tz_path = os.path.join(tmp, "model.tensors")

        def tz_save_fn():
            ser = TensorSerializer(tz_path)
            ser.write_module(model)
            ser.close()

        def tz_load_fn():
            with no_init_or_tensor():
                m = TinyGPT()
            sets = non_persistent_sets(m)
            deser = TensorDeserializer(tz_path, device="cpu")
            n = deser.load_into_module(m)
            deser.close()
            restore_non_persistent(m, sets)
            return m, n

        tz_save, _ = best_of(tz_save_fn)
        tz_load, (loaded, n_loaded) = best_of(tz_load_fn)
        loaded.eval()
        rows.append(("tensorizer (ours)", os.path.getsize(tz_path), tz_save, tz_load))

        # ---------------- torch.save / torch.load --------------------------
        pt_path = os.path.join(tmp, "model.pt")

        def pt_save_fn():
            torch.save(model.state_dict(), pt_path)

        def pt_load_fn():
            with no_init_or_tensor():
                m = TinyGPT()
            sd = torch.load(pt_path, map_location="cpu", weights_only=True)
            m.load_state_dict(sd, assign=True)
            return m

        pt_save, _ = best_of(pt_save_fn)
        pt_load, loaded_pt = best_of(pt_load_fn)
        loaded_pt.eval()
        rows.append(("torch.save/torch.load", os.path.getsize(pt_path), pt_save, pt_load))

    # ---------------- checks -------------------------------------------------
    print(f"load_into_module loaded {n_loaded} tensors")
    metas = [n for n, t in list(loaded.named_parameters()) + list(loaded.named_buffers())
             if t.device.type == "meta"]
    if metas:
        failures.append(f"tensors left on meta device after load: {metas[:5]}")
    ref_sd, got_sd = model.state_dict(), loaded.state_dict()
    if ref_sd.keys() != got_sd.keys():
        failures.append(f"state_dict keys differ: {sorted(ref_sd.keys() ^ got_sd.keys())[:5]}")
    else:
        bad = [k for k in ref_sd if not (ref_sd[k].dtype == got_sd[k].dtype
                                         and torch.equal(ref_sd[k], got_sd[k]))]
        if bad:
            failures.append(f"weights differ: {bad[:5]}")
    for name, buf in model.named_buffers():  # including the non-persistent mask
        got = dict(loaded.named_buffers()).get(name)
        if got is None or not torch.equal(buf, got):
            failures.append(f"buffer {name} differs")

    with torch.no_grad():
        out = loaded(idx)
        out_pt = loaded_pt(idx)
    same = torch.equal(ref_out, out)
    same_pt = torch.equal(ref_out, out_pt)
    if not same:
        diff = (ref_out - out).abs().max().item()
        failures.append(f"outputs differ (max abs diff {diff})")

    # ---------------- table ---------------------------------------------------
    print()
    hdr = f"{'':<24}{'file MB':>9}{'save s':>9}{'save GB/s':>11}{'load s':>9}{'load GB/s':>11}"
    print(hdr)
    print("-" * len(hdr))
    for name, size, s, l in rows:
        print(f"{name:<24}{size / 1e6:>9.1f}{s:>9.3f}{nbytes / s / 1e9:>11.2f}"
              f"{l:>9.3f}{nbytes / l / 1e9:>11.2f}")
    (_, _, s_tz, l_tz), (_, _, s_pt, l_pt) = rows
    print(f"{'ours vs torch':<24}{'':>9}{s_pt / s_tz:>8.2f}x{'':>11}{l_pt / l_tz:>8.2f}x")
    print("(load = build module under no_init_or_tensor + deserialize into it; "
          "best of 3 each; noisy machine)")
    print()
    print(f"outputs bit-identical: ours {'YES' if same else 'NO'}, "
          f"torch {'YES' if same_pt else 'NO'}  (logits {tuple(ref_out.shape)})")
    if failures:
        for f in failures:
            print("FAIL:", f)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
