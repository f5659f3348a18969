#!/usr/bin/env python3
"""Local benchmark: our tensorizer vs upstream tensorizer 2.12.1 vs torch.save/torch.load.

Run from the repository root:

    .venv/bin/python bench/bench_local.py [--size-gib 1.0] [--repeats 3] \
        [--out bench/out/results.json] [--bench-dir /tmp/tz-bench]

Every measurement runs in a FRESH subprocess (so peak RSS is per measurement);
"ours" runs under $TZ_BENCH_OURS_PYTHON (default .venv/bin/python, with
$TZ_BENCH_OURS_PYTHONPATH, default tz-python/, prepended to PYTHONPATH), and
"upstream" under $TZ_BENCH_UPSTREAM_PYTHON (default .venv-upstream/bin/python,
PYTHONPATH cleared).  The machine is small and noisy: the script reports
ratios between peers measured in the same run, best-of-N, and never asserts
on timings (its exit status is 0 unless the harness itself breaks).

This file is also its own worker: `python bench_local.py --worker JSON`.
Only the standard library is imported at module level, so any of the
interpreters above can run it.
"""

import argparse
import datetime
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULT_TAG = "TZBENCH_RESULT "
MANIFEST_VERSION = 2
MiB = 1 << 20
GiB = 1 << 30


# --------------------------------------------------------------------------
# Helpers shared by the driver and the workers (stdlib only at import time)
# --------------------------------------------------------------------------


def _proc_status_kib(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _current_rss_kib():
    v = _proc_status_kib("VmRSS")
    return v if v is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _peak_rss_kib():
    # VmHWM is this address space's high-water mark.  ru_maxrss would be the
    # same thing, except that Linux carries it across fork+exec, so a worker
    # would report the (larger) driver's peak; use it only as a fallback.
    v = _proc_status_kib("VmHWM")
    return v if v is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def fingerprint_state_dict(items):
    """Cheap content fingerprint: per tensor, name/dtype/shape plus the first
    and last 4 KiB and ~4096 strided bytes.  Catches wrong offsets, swapped
    tensors, wrong dtypes; runs after timing, so it never affects results."""
    import torch

    h = hashlib.sha256()
    nbytes = 0
    count = 0
    for name, t in sorted(items, key=lambda kv: str(kv[0])):
        t = t.detach()
        h.update(str(name).encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        flat = t.contiguous().reshape(-1).view(torch.uint8)
        n = flat.numel()
        nbytes += n
        count += 1
        if n:
            h.update(flat[:4096].numpy().tobytes())
            h.update(flat[-4096:].numpy().tobytes())
            step = max(1, n // 4096)
            h.update(flat[::step].numpy().tobytes())
    return h.hexdigest()[:16], nbytes, count


# --------------------------------------------------------------------------
# Checkpoint construction
# --------------------------------------------------------------------------

VOCAB = 32000


def plan_model(size_gib):
    """Pick hidden size d (multiple of 128) and layer count L such that the
    fp16 transformer-shaped checkpoint is ~size_gib."""
    target_params = size_gib * GiB / 2
    # With 12 layers: 12*L*d^2 + V*d ~= target  ->  solve for d.
    L0 = 12
    a, b, c = 12 * L0, VOCAB, -target_params
    d = (-b + (b * b - 4 * a * c) ** 0.5) / (2 * a)
    d = max(128, int(round(d / 128)) * 128)
    per_layer = 12 * d * d + 9 * d + 4 * d  # weights + biases + 2 layernorms
    L = max(1, int(round((target_params - VOCAB * d - 2 * d) / per_layer)))
    return d, L


def build_state_dict(size_gib, seed):
    import torch

    d, L = plan_model(size_gib)
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(torch.float16)

    sd = {}
    sd["model.embed_tokens.weight"] = rnd(VOCAB, d)
    for i in range(L):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = (1 + rnd(d)).to(torch.float16)
        sd[p + "input_layernorm.bias"] = rnd(d)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + f"self_attn.{proj}.weight"] = rnd(d, d)
            sd[p + f"self_attn.{proj}.bias"] = rnd(d)
        sd[p + "post_attention_layernorm.weight"] = (1 + rnd(d)).to(
            torch.float16
        )
        sd[p + "post_attention_layernorm.bias"] = rnd(d)
        sd[p + "mlp.up_proj.weight"] = rnd(4 * d, d)
        sd[p + "mlp.up_proj.bias"] = rnd(4 * d)
        sd[p + "mlp.down_proj.weight"] = rnd(d, 4 * d)
        sd[p + "mlp.down_proj.bias"] = rnd(d)
    sd["model.norm.weight"] = (1 + rnd(d)).to(torch.float16)
    sd["model.norm.bias"] = rnd(d)
    return sd, d, L


# --------------------------------------------------------------------------
# Worker side
# --------------------------------------------------------------------------


def _tz_module_info():
    import tensorizer

    return {
        "module": getattr(tensorizer, "__file__", None),
        "version": getattr(tensorizer, "__version__", None),
    }


def worker_save(spec):
    import torch

    impl = spec["impl"]
    info = {}
    if impl in ("ours", "upstream"):
        from tensorizer import TensorSerializer

        info = _tz_module_info()
    sd = torch.load(spec["src"], map_location="cpu", weights_only=True)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    dst = spec["dst"]
    if os.path.exists(dst):
        os.unlink(dst)
    base = _current_rss_kib()
    t0 = time.perf_counter()
    if impl == "torch":
        torch.save(sd, dst)
    else:
        s = TensorSerializer(dst)
        s.write_state_dict(sd)
        s.close()
    dt = time.perf_counter() - t0
    peak = _peak_rss_kib()
    return dict(
        info,
        seconds=dt,
        bytes=nbytes,
        file_bytes=os.path.getsize(dst),
        rss_base_kib=base,
        rss_peak_kib=peak,
    )


def _prewarm_memory(nbytes):
    """Touch and release `nbytes` of anonymous memory before timing a load.

    In a VM the first touch of guest memory the hypervisor has not backed
    costs a host fault per page, which dominates a cold 1 GiB load and hides
    the software; released pages stay backed for a while, so the timed load
    that follows measures the steady state. Applied to every peer alike.
    """
    import mmap

    import numpy as np

    m = mmap.mmap(-1, nbytes)
    view = np.frombuffer(m, dtype=np.uint8)
    view[::4096] = 1
    del view
    m.close()


def worker_load(spec):
    import torch

    impl = spec["impl"]
    info = {}
    if impl in ("ours", "upstream"):
        from tensorizer import TensorDeserializer

        info = _tz_module_info()
    path = spec["path"]
    if spec.get("prewarm_mib"):
        _prewarm_memory(spec["prewarm_mib"] << 20)
    base = _current_rss_kib()
    keep = None
    t0 = time.perf_counter()
    if impl in ("ours", "upstream"):
        kwargs = dict(device="cpu", lazy_load=False)
        if spec.get("num_readers") is not None:
            kwargs["num_readers"] = spec["num_readers"]
        if spec.get("verify_hash"):
            kwargs["verify_hash"] = True
        deser = TensorDeserializer(path, **kwargs)
        items = list(deser.items())
        keep = deser
    elif impl == "torch":
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=False)
        items = list(sd.items())
    elif impl == "torch_mmap":
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        items = list(sd.items())
    else:
        raise ValueError(f"unknown impl {impl!r}")
    dt = time.perf_counter() - t0
    peak = _peak_rss_kib()
    nbytes = sum(t.numel() * t.element_size() for _, t in items)
    # After timing and after the peak-RSS reading:
    fp, _, count = fingerprint_state_dict(items)
    if keep is not None and hasattr(keep, "close"):
        try:
            keep.close()
        except Exception:
            pass
    return dict(
        info,
        seconds=dt,
        bytes=nbytes,
        tensors=count,
        fingerprint=fp,
        rss_base_kib=base,
        rss_peak_kib=peak,
    )


def timed_load(source, kwargs, prewarm_mib=None):
    """The load measurement the bench workers share: (prewarm), reset the
    peak RSS, then time TensorDeserializer(source, **kwargs) and its items();
    `source` may be a callable that opens it (timed too)."""
    from tensorizer import TensorDeserializer

    info = _tz_module_info()
    if prewarm_mib:
        _prewarm_memory(prewarm_mib << 20)
    hwm_reset = reset_peak_rss()
    base = _current_rss_kib()
    t0 = time.perf_counter()
    deser = TensorDeserializer(source() if callable(source) else source, **kwargs)
    items = list(deser.items())
    dt = time.perf_counter() - t0
    peak = _peak_rss_kib()
    nbytes = sum(t.numel() * t.element_size() for _, t in items)
    fp, _, count = fingerprint_state_dict(items)  # after timing
    try:
        deser.close()
    except Exception:
        pass
    return dict(info, seconds=dt, bytes=nbytes, tensors=count, fingerprint=fp,
                rss_base_kib=base, rss_peak_kib=peak, hwm_reset=hwm_reset)


def serve_worker(spec_json, handlers, before=None):
    """Worker entry shared by the bench scripts: runs handlers[spec["kind"]]
    and prints its result (or the error) on one tagged line."""
    spec = json.loads(spec_json)
    os.environ.update(spec.get("env", {}))
    if before is not None:
        before(spec)
    try:
        fn = handlers.get(spec["kind"])
        if fn is None:
            raise ValueError(f"unknown kind {spec['kind']!r}")
        res = fn(spec)
        res["ok"] = True
    except BaseException as e:  # report, don't crash silently
        import traceback

        res = {
            "ok": False,
            "error": f"{type(e).__name__}: {e}",
            "traceback": traceback.format_exc()[-4000:],
        }
    sys.stdout.write(RESULT_TAG + json.dumps(res) + "\n")
    sys.stdout.flush()
    return 0


def worker_main(spec_json):
    return serve_worker(spec_json, {"save": worker_save, "load": worker_load})


def reset_peak_rss():
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs),
    so the peak read after timing belongs to the timed operation and not to
    the prewarm or the imports.  Returns whether it worked."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# --------------------------------------------------------------------------
# Driver side
# --------------------------------------------------------------------------


def throughput_ratio(a, b):
    """Throughput of run a over run b (bytes per second each), or None."""
    if a is None or b is None:
        return None
    return (a["bytes"] / a["seconds"]) / (b["bytes"] / b["seconds"])


def target_row(name, value, target, note, unit="x"):
    """One row of the targets table (value >= target passes)."""
    return dict(name=name, value=value, target=target, note=note, unit=unit,
                status=None if value is None or target is None else
                ("PASS" if value >= target else "MISS"))


def first_info(results, keys):
    """The first successful run among `keys` that reports its tensorizer module."""
    for k in keys:
        for x in results.get(k, []):
            if x.get("ok") and x.get("module"):
                return x
    return {}


def rss_target(name, row, data_bytes, note):
    """The peak-RSS target row: `row`'s RSS growth under checkpoint + 256 MiB."""
    limit_mib = data_bytes / MiB + 256
    rss = None if row is None else (row["rss_peak_kib"] - row["rss_base_kib"]) / 1024
    return dict(name=name, value=rss, target=limit_mib, unit="MiB",
                note=f"{note}; must be < checkpoint {data_bytes / MiB:.0f} MiB + 256 MiB",
                status=None if rss is None else ("PASS" if rss < limit_mib else "MISS"))


def print_targets(ratios, best, results, ref_fp, width=34):
    """The "targets:" block, then warnings for data mismatches and failed runs."""
    print("targets:")
    for x in ratios:
        tgt = "" if x["target"] is None else (
            f"< {x['target']:.0f}M" if x.get("unit") == "MiB" else f">= {x['target']:.2f}x")
        st = x["status"] or ""
        if x["value"] is None:
            print(f"  {x['name']:<{width}} {'n/a':>8}   FAILED      ({x['note']})")
        elif x.get("unit") == "MiB":
            print(f"  {x['name']:<{width}} {x['value']:>7.0f}M   {tgt:<9} {st:<4}  ({x['note']})")
        else:
            print(f"  {x['name']:<{width}} {x['value']:>7.2f}x   {tgt:<9} {st:<4}  ({x['note']})")
    mism = [k for k, v in best.items() if v and k.startswith("load.")
            and "fingerprint" in v and v["fingerprint"] != ref_fp]
    if mism:
        print(f"  WARNING: loaded data differs from the reference in: {mism}")
    failed = sorted(k for k, v in results.items() if any(not x.get("ok") for x in v))
    if failed:
        print(f"  runs that failed (see JSON for errors): {failed}")


def write_report(path, args, man, peers, infos, best, ref_fp, ratios, results, **extra):
    """Writes the JSON every bench script produces: host, arguments,
    checkpoint, peers, best rows, ratios and every run, plus `extra`."""
    if not path:
        return
    rows = {}
    for k, v in best.items():
        if v is None:
            rows[k] = None
            continue
        rows[k] = dict(
            seconds=v["seconds"], gb_per_s=v["bytes"] / v["seconds"] / 1e9,
            rss_delta_mib=(v["rss_peak_kib"] - v["rss_base_kib"]) / 1024,
            rss_peak_mib=v["rss_peak_kib"] / 1024,
            data_ok=(v.get("fingerprint") == ref_fp) if "fingerprint" in v else None)
        if "object_bytes" in v:
            rows[k]["object_bytes"] = v["object_bytes"]
    out = dict(
        timestamp=datetime.datetime.now().isoformat(timespec="seconds"),
        host=dict(cpus=os.cpu_count(), platform=platform.platform(),
                  python=sys.version.split()[0]),
        args=dict(vars(args), worker=None),
        checkpoint=man,
        peers={p.name: dict(python=p.python, pythonpath=p.pythonpath,
                            **{k: info.get(k) for k in ("module", "version")})
               for p, info in zip(peers, infos)},
        best=rows,
        ratios=ratios,
        runs=results,
        **extra,
    )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
    print(f"\nwrote {path}")


class Peer:
    def __init__(self, name, python, pythonpath):
        self.name = name
        self.python = python
        self.pythonpath = pythonpath  # None = clear PYTHONPATH

    def env(self):
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env


def default_peers():
    """(ours, upstream): interpreters from $TZ_BENCH_* or the repository's venvs."""
    ours = Peer(
        "ours",
        os.environ.get("TZ_BENCH_OURS_PYTHON", os.path.join(REPO, ".venv", "bin", "python")),
        os.environ.get("TZ_BENCH_OURS_PYTHONPATH", os.path.join(REPO, "tz-python")),
    )
    upstream = Peer(
        "upstream",
        os.environ.get("TZ_BENCH_UPSTREAM_PYTHON", os.path.join(REPO, ".venv-upstream", "bin", "python")),
        None,
    )
    return ours, upstream


def lock_bench_dir(bench_dir):
    """One run at a time per bench dir: concurrent runs would clobber each
    other's files and, on a 2-core box, each other's timings. Returns the
    open lock file; keep it until the run ends."""
    import fcntl

    os.makedirs(bench_dir, exist_ok=True)
    lock = open(os.path.join(bench_dir, ".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"[setup] another bench run holds {bench_dir}/.lock; waiting", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def run_worker(peer, spec, timeout, script=None):
    """Runs `script` (default: this file) as a worker under the peer's interpreter."""
    cmd = [peer.python, script or os.path.abspath(__file__), "--worker", json.dumps(spec)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            cmd,
            cwd=REPO,
            env=peer.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=timeout,
            text=True,
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timeout after {timeout}s"}
    except OSError as e:
        return {"ok": False, "error": f"cannot start {peer.python}: {e}"}
    wall = time.perf_counter() - t0
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            res = json.loads(line[len(RESULT_TAG):])
            res["wall_seconds"] = wall
            if p.returncode != 0 and res.get("ok"):
                res["ok"] = False
                res["error"] = f"worker exited with {p.returncode}"
            return res
    tail = (p.stderr or "")[-2000:]
    return {
        "ok": False,
        "error": f"worker exited with {p.returncode} and no result",
        "stderr_tail": tail,
    }


def warm_page_cache(path):
    """Read the whole file once so load timings see a hot page cache."""
    if not os.path.exists(path):
        return
    buf = bytearray(16 * MiB)
    mv = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(mv):
            pass


def ensure_checkpoint(args):
    """Create (or reuse) the reference torch.save checkpoint."""
    os.makedirs(args.bench_dir, exist_ok=True)
    src = os.path.join(args.bench_dir, "model.pt")
    man_path = os.path.join(args.bench_dir, "manifest.json")
    want = {"version": MANIFEST_VERSION, "size_gib": args.size_gib, "seed": args.seed}
    if not args.regen and os.path.exists(src) and os.path.exists(man_path):
        try:
            with open(man_path) as f:
                man = json.load(f)
            if all(man.get(k) == v for k, v in want.items()):
                print(f"[setup] reusing {src}")
                return src, man
        except (OSError, ValueError):
            pass
    import torch

    t0 = time.perf_counter()
    sd, d, L = build_state_dict(args.size_gib, args.seed)
    fp, nbytes, count = fingerprint_state_dict(sd.items())
    torch.save(sd, src)
    del sd
    man = dict(
        want,
        hidden=d,
        layers=L,
        vocab=VOCAB,
        tensors=count,
        data_bytes=nbytes,
        fingerprint=fp,
        torch_version=torch.__version__,
    )
    with open(man_path, "w") as f:
        json.dump(man, f, indent=1)
    print(
        f"[setup] built {count} tensors, {nbytes / GiB:.3f} GiB "
        f"(d={d}, layers={L}) in {time.perf_counter() - t0:.1f}s -> {src}"
    )
    return src, man


def add_run_args(ap):
    """The options every bench script shares (besides size, repeats and dirs)."""
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--timeout", type=int, default=900, help="per-worker seconds")
    ap.add_argument("--regen", action="store_true", help="rebuild the checkpoint")
    ap.add_argument("--worker", help=argparse.SUPPRESS)


def open_checkpoint(args):
    """Locks the bench dir (one run at a time: concurrent runs skew each
    other's timings), then makes or reuses model.pt in its size/seed
    subfolder. Returns (lock, path, manifest); hold the lock until exit."""
    lock = lock_bench_dir(args.bench_dir)
    args.bench_dir = os.path.join(args.bench_dir, f"size{args.size_gib:g}-seed{args.seed}")
    src, man = ensure_checkpoint(args)
    return lock, src, man


def best_of(results):
    ok = [r for r in results if r.get("ok")]
    if not ok:
        return None
    return min(ok, key=lambda r: r["seconds"])


def fmt_row(label, best, results, data_bytes, ref_fp, cols, gbs_decimals=2):
    if best is None:
        errs = [r.get("error", "?") for r in results if not r.get("ok")]
        err = errs[-1] if errs else "not run"
        return f"{label:<{cols}}  FAILED: {err[:110]}"
    gbs = best["bytes"] / best["seconds"] / 1e9
    delta = (best["rss_peak_kib"] - best["rss_base_kib"]) / 1024
    peak = best["rss_peak_kib"] / 1024
    check = ""
    if ref_fp is not None and "fingerprint" in best:
        check = "ok" if best["fingerprint"] == ref_fp else "MISMATCH"
    nfail = sum(1 for r in results if not r.get("ok"))
    extra = f" ({nfail} failed)" if nfail else ""
    return (
        f"{label:<{cols}}  {best['seconds']:>8.3f}  {gbs:>7.{gbs_decimals}f}  "
        f"{delta:>9.0f}  {peak:>9.0f}  {check:<8}{extra}"
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "out", "results.json"))
    ap.add_argument(
        "--bench-dir", default=os.environ.get("TZ_BENCH_DIR", "/tmp/tz-bench")
    )
    ap.add_argument("--readers", default="1,2,4,8", help="num_readers sweep")
    ap.add_argument("--prewarm-mib", type=int, default=0,
                    help="touch and release this much memory in each load worker before"
                         " timing (steady-state rather than cold-VM figures); peak RSS"
                         " then includes it")
    ap.add_argument(
        "--keep-files", action="store_true", help="keep the bench dir afterwards"
    )
    add_run_args(ap)
    args = ap.parse_args(argv)
    if args.worker is not None:
        return worker_main(args.worker)

    sweep = [int(x) for x in args.readers.split(",") if x.strip()]
    ours, upstream = default_peers()
    torchp = Peer("torch", ours.python, None)

    lock, src, man = open_checkpoint(args)  # noqa: F841 - lock held until exit
    data_bytes = man["data_bytes"]
    ref_fp = man["fingerprint"]
    d = args.bench_dir
    f_ours = os.path.join(d, "ours.tensors")
    f_up = os.path.join(d, "upstream.tensors")
    f_torch = os.path.join(d, "torch_save.pt")

    # ---- configurations ------------------------------------------------
    # (key, label, peer, spec, group) ; group used for best-of-sweep rows
    saves = [
        ("save.ours", "save  ours   write_state_dict", ours,
         dict(kind="save", impl="ours", src=src, dst=f_ours)),
        ("save.upstream", "save  upstream write_state_dict", upstream,
         dict(kind="save", impl="upstream", src=src, dst=f_up)),
        ("save.torch", "save  torch.save", torchp,
         dict(kind="save", impl="torch", src=src, dst=f_torch)),
    ]
    loads = [
        ("load.ours.default", "load  ours   (default readers)", ours,
         dict(kind="load", impl="ours", path=f_ours, num_readers=None)),
    ]
    for n in sweep:
        loads.append((f"load.ours.r{n}", f"load  ours   num_readers={n}", ours,
                      dict(kind="load", impl="ours", path=f_ours, num_readers=n)))
    loads.append(("load.ours.thp", "load  ours   TENSORIZER_HUGE_PAGES=1", ours,
                  dict(kind="load", impl="ours", path=f_ours,
                       env={"TENSORIZER_HUGE_PAGES": "1"})))
    loads.append(("load.ours.verify", "load  ours   verify_hash (default)", ours,
                  dict(kind="load", impl="ours", path=f_ours, verify_hash=True)))
    loads.append(("load.ours.upfile", "load  ours   of upstream's file", ours,
                  dict(kind="load", impl="ours", path=f_up)))
    for n in sweep:
        loads.append((f"load.upstream.r{n}", f"load  upstream num_readers={n}",
                      upstream,
                      dict(kind="load", impl="upstream", path=f_up, num_readers=n)))
    for n in sweep:
        loads.append((f"load.upstream.verify.r{n}",
                      f"load  upstream verify_hash r={n}", upstream,
                      dict(kind="load", impl="upstream", path=f_up,
                           num_readers=n, verify_hash=True)))
    loads.append(("load.torch", "load  torch.load(mmap=False)", torchp,
                  dict(kind="load", impl="torch", path=src)))
    loads.append(("load.torch_mmap", "load  torch.load(mmap=True) (lazy)", torchp,
                  dict(kind="load", impl="torch_mmap", path=src)))
    if args.prewarm_mib:
        for _, _, _, spec in loads:
            spec["prewarm_mib"] = args.prewarm_mib

    results = {k: [] for k, *_ in saves + loads}

    # ---- phase 1: saves (interleaved repeats) -----------------------------
    print(f"[run] {len(saves)} save configs x {args.repeats} repeats", flush=True)
    warm_page_cache(src)
    for r in range(args.repeats):
        for key, label, peer, spec in saves:
            res = run_worker(peer, spec, args.timeout)
            results[key].append(res)
            _progress(key, r, res)
    if os.path.exists(f_torch):
        os.unlink(f_torch)  # not needed for loads; model.pt is the torch file

    # ---- phase 2: loads (interleaved repeats) -----------------------------
    print(f"[run] {len(loads)} load configs x {args.repeats} repeats", flush=True)
    for r in range(args.repeats):
        for key, label, peer, spec in loads:
            path = spec["path"]
            if not os.path.exists(path):
                res = {"ok": False, "error": f"no file {os.path.basename(path)} "
                       "(its save failed)"}
            else:
                warm_page_cache(path)
                res = run_worker(peer, spec, args.timeout)
            results[key].append(res)
            _progress(key, r, res)

    # ---- summarise ---------------------------------------------------------
    best = {k: best_of(v) for k, v in results.items()}

    def best_group(prefix_keys):
        cands = [(k, best[k]) for k in prefix_keys if best.get(k)]
        if not cands:
            return None, None
        return min(cands, key=lambda kv: kv[1]["seconds"])

    up_key, up_best = best_group([f"load.upstream.r{n}" for n in sweep])
    upv_key, upv_best = best_group([f"load.upstream.verify.r{n}" for n in sweep])
    ours_best_key, ours_best_any = best_group(
        ["load.ours.default"] + [f"load.ours.r{n}" for n in sweep]
    )
    best["load.upstream.best"] = up_best
    best["load.upstream.verify.best"] = upv_best

    ratios = []

    def add_ratio(name, a, b, target, note):
        ratios.append(target_row(name, throughput_ratio(a, b), target, note))

    add_ratio("load ours / upstream", best["load.ours.default"], up_best, 3.0,
              f"ours default readers vs upstream best ({up_key})")
    add_ratio("load ours / torch.load", best["load.ours.default"],
              best["load.torch"], 2.0, "torch.load(mmap=False, weights_only=True)")
    add_ratio("verify ours / upstream", best["load.ours.verify"], upv_best, 3.0,
              f"verify_hash=True; upstream best ({upv_key})")
    add_ratio("save ours / upstream", best["save.ours"], best["save.upstream"],
              2.0, "write_state_dict + close()")
    ratios.append(rss_target("load ours peak RSS delta", best["load.ours.default"],
                             data_bytes, "load.ours.default"))

    # ---- print -------------------------------------------------------------
    info_ours = first_info(results, ["load.ours.default", "save.ours"])
    info_up = first_info(results, [f"load.upstream.r{n}" for n in sweep] + ["save.upstream"])
    print()
    print(f"checkpoint: {man['tensors']} fp16 tensors, "
          f"{data_bytes / GiB:.3f} GiB data (d={man['hidden']}, "
          f"layers={man['layers']}, vocab={man['vocab']}), dir {d}")
    print(f"ours:     {ours.python}  tensorizer {info_ours.get('version')} "
          f"from {info_ours.get('module')}")
    print(f"upstream: {upstream.python}  tensorizer {info_up.get('version')} "
          f"from {info_up.get('module')}")
    print(f"host: {os.cpu_count()} CPUs; best of {args.repeats}; "
          "GB/s = 1e9 bytes of tensor data per second; page cache warm")
    cols = 36
    print()
    print(f"{'row':<{cols}}  {'seconds':>8}  {'GB/s':>7}  {'dRSS MiB':>9}  "
          f"{'peak MiB':>9}  data")
    print("-" * (cols + 50))
    labels = {k: lbl for k, lbl, *_ in saves + loads}
    for key, *_ in saves + loads:
        line = fmt_row(labels[key], best[key], results[key], data_bytes,
                       ref_fp if key.startswith("load.") else None, cols)
        if key == up_key or key == upv_key:
            line += "  <- best upstream"
        print(line)
    print()
    print_targets(ratios, best, results, ref_fp)
    dflt = best["load.ours.default"]
    if ours_best_any is not None and dflt is not None and \
            ours_best_key != "load.ours.default":
        print(f"  (info) fastest ours load config: {ours_best_key}, "
              f"{dflt['seconds'] / ours_best_any['seconds']:.2f}x the default's speed")

    write_report(args.out, args, man, (ours, upstream), (info_ours, info_up), best, ref_fp,
                 ratios, results, best_upstream_load=up_key, best_upstream_verify=upv_key)
    if not args.keep_files:
        for p in (f_ours, f_up):
            if os.path.exists(p):
                os.unlink(p)
    return 0


def _progress(key, r, res):
    if res.get("ok"):
        print(f"  {key:<28} #{r + 1}  {res['seconds']:8.3f}s", flush=True)
    else:
        print(f"  {key:<28} #{r + 1}  FAILED: {res.get('error')}", flush=True)
        tb = res.get("traceback") or res.get("stderr_tail")
        if tb:
            print("    " + tb.strip().splitlines()[-1][:200], flush=True)


if __name__ == "__main__":
    sys.exit(main())
