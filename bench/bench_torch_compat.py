#!/usr/bin/env python3
"""torch_compat benchmark: torch.save / torch.load of a whole model inside our
tensorizer_saving / tensorizer_loading vs plain torch vs upstream's torch_compat.

Run from the repository root:

    .venv/bin/python bench/bench_torch_compat.py [--size-gib 1.0] [--repeats 3] \
        [--out bench/out/torch_compat.json] [--bench-dir /tmp/tz-bench]

The model is an ``nn.Sequential``: a float16 embedding, pairs of ``nn.Linear``
layers (d -> 4d in float16, 4d -> d in bfloat16) and an output ``nn.Linear``
whose weight is tied to the embedding (so the checkpoint also exercises shared
storages). Each measurement is a fresh process that first gets the model into
ordinary memory (untimed: ``torch.load`` of a plain state dict built once by the
driver, then ``load_state_dict(assign=True)``), then times exactly one of:

* save: ``torch.save(model, path)`` -- plain (ours' interpreter), inside
  ``tensorizer_saving()`` (ours), inside upstream's ``tensorizer_saving()``
  (upstream's interpreter, same torch version); "cold" is the first save in
  the process, "steady" follows one untimed identical save;
* load: ``torch.load(path, weights_only=False)`` -- plain with
  ``map_location="cpu", mmap=False``, or inside ``tensorizer_loading(device="cpu")``
  of ours / upstream, each reading the files its own save wrote.

Same conventions as bench_local.py, whose helpers it imports: interpreters from
$TZ_BENCH_OURS_PYTHON / $TZ_BENCH_UPSTREAM_PYTHON, one run per bench dir at a
time, repeats interleaved across peers, best of --repeats, ratios between
peers of the same run, never fails on timings. Loads run "cold" (fresh
process) and "steady" (the worker first touches and releases --prewarm-mib of
memory, see bench/README.md); each save starts after an os.sync(), so
writeback from earlier runs does not land in its timing. This file is also its
own worker (``--worker JSON``); only the standard library is imported at
module level.
"""

import argparse
import datetime
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import bench_local as bl  # noqa: E402  (stdlib-only at import, same directory)

MiB = bl.MiB
GiB = bl.GiB
VOCAB = 32000
MANIFEST_VERSION = 1


# --------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------


def plan(size_gib):
    """Hidden size d (multiple of 128) and pair count for about size_gib:
    embedding V*d + pairs * 8*d*d parameters, 2 bytes each."""
    target = size_gib * GiB / 2
    d = 2048 if size_gib >= 0.5 else 512
    pairs = max(1, int(round((target - VOCAB * d) / (8 * d * d))))
    return d, pairs


def build_model(d, pairs, device="cpu"):
    import torch
    from torch import nn

    layers = [nn.Embedding(VOCAB, d, device=device, dtype=torch.float16)]
    for _ in range(pairs):
        layers.append(nn.Linear(d, 4 * d, device=device, dtype=torch.float16))
        layers.append(nn.Linear(4 * d, d, device=device, dtype=torch.bfloat16))
    head = nn.Linear(d, VOCAB, bias=False, device=device, dtype=torch.float16)
    head.weight = layers[0].weight  # tied: one storage, saved once
    layers.append(head)
    model = nn.Sequential(*layers)
    model.bench_note = {"d": d, "pairs": pairs}  # a non-tensor attribute
    return model


def model_bytes(model):
    """Bytes of distinct storages (tied weights counted once)."""
    seen = {}
    for t in list(model.parameters()) + list(model.buffers()):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def fingerprint(model):
    return bl.fingerprint_state_dict(model.state_dict().items())[0]


# --------------------------------------------------------------------------
# Workers
# --------------------------------------------------------------------------


def _sync():
    # Flush earlier runs' dirty pages first, so background writeback (on 2 cores)
    # does not land in the next timing; untimed and the same for every peer.
    if hasattr(os, "sync"):
        os.sync()


def _contexts(impl):
    if impl == "torch":
        return None, None
    # The same import for both peers: each interpreter has its own tensorizer.
    from tensorizer.torch_compat import tensorizer_loading, tensorizer_saving

    return tensorizer_saving, tensorizer_loading


def worker_build(spec):
    import torch

    torch.manual_seed(spec["seed"])
    model = build_model(spec["d"], spec["pairs"], device="meta")
    sd = {}
    for name, t in model.state_dict(keep_vars=False).items():
        if name == f"{2 * spec['pairs'] + 1}.weight":
            continue  # the tied head
        sd[name] = (torch.randn(t.shape) * 0.02).to(t.dtype)
    torch.save(sd, spec["dst"])
    model = build_model(spec["d"], spec["pairs"], device="meta")
    model.load_state_dict(sd, assign=True, strict=False)
    model[-1].weight = model[0].weight
    return dict(seconds=0.0, fingerprint=fingerprint(model), bytes=model_bytes(model))


def _materialize(spec):
    import torch

    sd = torch.load(spec["src"], map_location="cpu", weights_only=True, mmap=False)
    model = build_model(spec["d"], spec["pairs"], device="meta")
    model.load_state_dict(sd, assign=True, strict=False)
    model[-1].weight = model[0].weight
    return model


def worker_save(spec):
    import torch

    saving, _ = _contexts(spec["impl"])
    info = bl._tz_module_info() if saving is not None else {}
    model = _materialize(spec)
    nbytes = model_bytes(model)
    dst = spec["dst"]
    sidecar = dst + ".tensors"

    def save():
        for p in (dst, sidecar):
            if os.path.exists(p):
                os.unlink(p)
        _sync()
        t0 = time.perf_counter()
        if saving is None:
            torch.save(model, dst)
        else:
            with saving():
                torch.save(model, dst)
        return time.perf_counter() - t0

    if spec.get("warmup"):
        save()  # steady mode: the same save once, untimed
    hwm_reset = bl.reset_peak_rss()
    base = bl._current_rss_kib()
    dt = save()
    peak = bl._peak_rss_kib()
    return dict(
        info,
        seconds=dt,
        bytes=nbytes,
        pt_bytes=os.path.getsize(dst),
        sidecar_bytes=os.path.getsize(sidecar) if os.path.exists(sidecar) else 0,
        rss_base_kib=base,
        rss_peak_kib=peak,
        hwm_reset=hwm_reset,
    )


def worker_load(spec):
    import torch

    _, loading = _contexts(spec["impl"])
    info = bl._tz_module_info() if loading is not None else {}
    if spec.get("prewarm_mib"):
        bl._prewarm_memory(spec["prewarm_mib"] << 20)
    hwm_reset = bl.reset_peak_rss()
    base = bl._current_rss_kib()
    t0 = time.perf_counter()
    if loading is None:
        model = torch.load(spec["path"], map_location="cpu", weights_only=False, mmap=False)
    else:
        with loading(device="cpu"):
            model = torch.load(spec["path"], weights_only=False)
    dt = time.perf_counter() - t0
    peak = bl._peak_rss_kib()
    tied = model[-1].weight is model[0].weight
    return dict(
        info,
        seconds=dt,
        bytes=model_bytes(model),
        fingerprint=fingerprint(model),  # after timing
        tied=tied,
        rss_base_kib=base,
        rss_peak_kib=peak,
        hwm_reset=hwm_reset,
    )


def worker_main(spec_json):
    return bl.serve_worker(
        spec_json, {"build": worker_build, "save": worker_save, "load": worker_load}
    )


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


def run_worker(peer, spec, timeout):
    return bl.run_worker(peer, spec, timeout, script=os.path.abspath(__file__))


def ensure_source(args, ours):
    """Build (or reuse) the plain state-dict file the workers start from."""
    d, pairs = plan(args.size_gib)
    os.makedirs(args.bench_dir, exist_ok=True)
    src = os.path.join(args.bench_dir, "source.pt")
    man_path = os.path.join(args.bench_dir, "manifest.json")
    want = dict(version=MANIFEST_VERSION, size_gib=args.size_gib, seed=args.seed, d=d, pairs=pairs)
    if not args.regen and os.path.exists(src) and os.path.exists(man_path):
        try:
            with open(man_path) as f:
                man = json.load(f)
            if all(man.get(k) == v for k, v in want.items()):
                print(f"[setup] reusing {src}", flush=True)
                return src, man
        except (OSError, ValueError):
            pass
    t0 = time.perf_counter()
    res = run_worker(ours, dict(kind="build", dst=src, seed=args.seed, d=d, pairs=pairs), args.timeout)
    if not res.get("ok"):
        raise SystemExit(f"building the model failed: {res.get('error')}\n{res.get('traceback', '')}")
    man = dict(want, fingerprint=res["fingerprint"], data_bytes=res["bytes"])
    with open(man_path, "w") as f:
        json.dump(man, f, indent=1)
    print(f"[setup] built d={d}, {pairs} layer pairs, {res['bytes'] / GiB:.3f} GiB"
          f" in {time.perf_counter() - t0:.1f}s -> {src}", flush=True)
    return src, man


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "out", "torch_compat.json"))
    ap.add_argument("--bench-dir", default=os.environ.get("TZ_BENCH_DIR", "/tmp/tz-bench"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--modes", default="cold,steady",
                    help="cold (fresh process) and/or steady (saves: after one untimed"
                         " identical save; loads: memory pre-touched)")
    ap.add_argument("--prewarm-mib", type=int, default=0,
                    help="steady mode: memory each load worker touches and releases"
                         " before timing (default: 2x the model + 256 MiB)")
    ap.add_argument("--timeout", type=int, default=900, help="per-worker seconds")
    ap.add_argument("--regen", action="store_true", help="rebuild the source model")
    ap.add_argument("--keep-files", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        return worker_main(args.worker)

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in ("cold", "steady") for m in modes):
        ap.error("--modes takes cold and/or steady")
    ours, upstream = bl.default_peers()
    torchp = bl.Peer("torch", ours.python, None)
    lock = bl.lock_bench_dir(args.bench_dir)  # noqa: F841 - held until exit
    args.bench_dir = os.path.join(args.bench_dir, f"compat-size{args.size_gib:g}-seed{args.seed}")
    src, man = ensure_source(args, ours)
    data_bytes = man["data_bytes"]
    ref_fp = man["fingerprint"]
    prewarm_mib = args.prewarm_mib or int(2 * data_bytes / MiB) + 256
    dirp = args.bench_dir
    common = dict(src=src, d=man["d"], pairs=man["pairs"])
    peers = [("torch", torchp), ("ours", ours), ("upstream", upstream)]
    files = {name: os.path.join(dirp, f"{name}.pt") for name, _ in peers}
    labels = {
        "torch": "plain torch",
        "ours": "ours torch_compat",
        "upstream": "upstream torch_compat",
    }
    keys = [f"{op}.{m}.{n}" for op in ("save", "load") for m in modes for n, _ in peers]
    results = {k: [] for k in keys}

    print(f"[run] saves ({', '.join(modes)}): {len(peers)} peers x {args.repeats}", flush=True)
    bl.warm_page_cache(src)
    for r in range(args.repeats):
        for mode in modes:
            for name, peer in peers:
                spec = dict(kind="save", impl=name, dst=files[name], warmup=mode == "steady", **common)
                res = run_worker(peer, spec, args.timeout)
                results[f"save.{mode}.{name}"].append(res)
                bl._progress(f"save.{mode}.{name}", r, res)
    _sync()
    print(f"[run] loads ({', '.join(modes)}): {len(peers)} peers x {args.repeats}", flush=True)
    for r in range(args.repeats):
        for mode in modes:
            for name, peer in peers:
                key = f"load.{mode}.{name}"
                path = files[name]
                if not os.path.exists(path):
                    res = {"ok": False, "error": "no file (its save failed)"}
                else:
                    bl.warm_page_cache(path)
                    bl.warm_page_cache(path + ".tensors")
                    spec = dict(kind="load", impl=name, path=path,
                                prewarm_mib=prewarm_mib if mode == "steady" else 0, **common)
                    res = run_worker(peer, spec, args.timeout)
                results[key].append(res)
                bl._progress(key, r, res)

    best = {k: bl.best_of(v) for k, v in results.items()}

    print()
    print(f"model: nn.Sequential, d={man['d']}, {man['pairs']} Linear pairs (fp16/bf16),"
          f" tied fp16 embedding/head; {data_bytes / GiB:.3f} GiB of distinct storages")
    print(f"host: {os.cpu_count()} CPUs; best of {args.repeats};"
          " GB/s = 1e9 bytes of tensor data per second; page cache warm for loads;"
          " [steady]: saves after one untimed identical save, loads after touching"
          f" and releasing {prewarm_mib} MiB")
    print()
    cols = 38
    print(f"{'row':<{cols}}  {'seconds':>8}  {'GB/s':>7}  {'dRSS MiB':>9}  {'.pt bytes':>13}  check")
    print("-" * (cols + 58))
    for key in keys:
        op, *rest = key.split(".")
        name = rest[-1]
        label = f"{op}  {labels[name]} [{rest[0]}]"
        b = best[key]
        if b is None:
            errs = [x.get("error", "?") for x in results[key]]
            print(f"{label:<{cols}}  FAILED: {(errs[-1] if errs else '?')[:100]}")
            continue
        gbs = b["bytes"] / b["seconds"] / 1e9
        drss = (b["rss_peak_kib"] - b["rss_base_kib"]) / 1024
        pt = f"{b['pt_bytes']:>13,}" if "pt_bytes" in b else " " * 13
        check = ""
        if "fingerprint" in b:
            check = "ok" if b["fingerprint"] == ref_fp and b.get("tied") else "MISMATCH"
        print(f"{label:<{cols}}  {b['seconds']:>8.3f}  {gbs:>7.2f}  {drss:>9.0f}  {pt}  {check}")

    def secs(*ks):
        vals = [best[k] for k in ks]
        return None if any(v is None for v in vals) else sum(v["seconds"] for v in vals)

    ratios = []
    for other in ("torch", "upstream"):
        rows = []
        for mode in modes:
            rows.append((f"save [{mode}]", [("save", mode)]))
            rows.append((f"load [{mode}]", [("load", mode)]))
            rows.append((f"save+load [{mode}]", [("save", mode), ("load", mode)]))
        for what, parts in rows:
            a = secs(*(".".join(p + ("ours",)) for p in parts))
            b = secs(*(".".join(p + (other,)) for p in parts))
            v = None if a is None or b is None else b / a
            ratios.append(dict(name=f"{what} ours / {other}", value=v, target=2.0,
                               status=None if v is None else ("PASS" if v >= 2.0 else "MISS")))
    pt_pct = None
    pt_best = best[f"save.{modes[0]}.ours"]
    if pt_best is not None:
        pt_pct = 100.0 * pt_best["pt_bytes"] / data_bytes
    ratios.append(dict(name=".pt size, % of tensor bytes (ours)", value=pt_pct, target=1.0,
                       status=None if pt_pct is None else ("PASS" if pt_pct < 1.0 else "MISS")))
    print()
    print("targets (time ratios, higher is better for ours):")
    for r in ratios:
        if r["value"] is None:
            print(f"  {r['name']:<38} n/a      FAILED")
        elif r["name"].startswith(".pt"):
            print(f"  {r['name']:<38} {r['value']:>8.4f}%  < 1%   {r['status']}")
        else:
            print(f"  {r['name']:<38} {r['value']:>8.2f}x  >= 2x  {r['status']}")

    out = dict(
        timestamp=datetime.datetime.now().isoformat(timespec="seconds"),
        host=dict(cpus=os.cpu_count(), platform=platform.platform(), python=sys.version.split()[0]),
        args=dict(vars(args), worker=None),
        model=man,
        prewarm_mib=prewarm_mib,
        best={k: (None if v is None else dict(
            seconds=v["seconds"], gb_per_s=v["bytes"] / v["seconds"] / 1e9,
            rss_delta_mib=(v["rss_peak_kib"] - v["rss_base_kib"]) / 1024,
            pt_bytes=v.get("pt_bytes"), sidecar_bytes=v.get("sidecar_bytes"),
            data_ok=(v["fingerprint"] == ref_fp and v.get("tied")) if "fingerprint" in v else None))
            for k, v in best.items()},
        ratios=ratios,
        runs=results,
    )
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        print(f"\nwrote {args.out}")
    if not args.keep_files:
        for p in files.values():
            for q in (p, p + ".tensors"):
                if os.path.exists(q):
                    os.unlink(q)
    return 0


if __name__ == "__main__":
    sys.exit(main())
