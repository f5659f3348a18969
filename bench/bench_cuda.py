#!/usr/bin/env python3
"""CUDA load benchmark: our tensorizer vs upstream 2.12.1 loading a checkpoint
to the GPU, against the pinned host-to-device bandwidth torch itself reaches.

    .venv/bin/python bench/bench_cuda.py [--size-gib 1.0] [--repeats 3] \
        [--readers 1,4,8] [--out bench/out/cuda.json] [--bench-dir /tmp/tz-bench]

Without a CUDA device it says so and exits 0 (CI has none).  Rows, each a
fresh worker process, best of --repeats, interleaved:

* torch pinned H2D: a pinned uint8 tensor of the checkpoint's size copied to
  the device (non_blocking, then synchronize), best of 5 inside the worker:
  the ceiling for any loader that stages through pinned memory;
* ours / upstream: TensorDeserializer(path, device="cuda", num_readers=N)
  over a warm page cache, timed until torch.cuda.synchronize() returns.

Target (issue 5): ours reaches at least 70% of the pinned H2D bandwidth.
Like bench_local.py (whose checkpoint, peers and worker plumbing it reuses)
it never asserts on timings.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_local as bl  # noqa: E402

GB = 1e9


def worker_h2d(spec):
    import torch

    n = int(spec["bytes"])
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    host.fill_(1)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    best = None
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return dict(seconds=best, bytes=n, device=torch.cuda.get_device_name())


def worker_load_cuda(spec):
    import torch
    from tensorizer import TensorDeserializer

    torch.cuda.init()
    torch.empty(1, device="cuda")  # context creation is not the loader's cost
    torch.cuda.synchronize()
    kwargs = dict(device="cuda", lazy_load=False)
    if spec.get("num_readers") is not None:
        kwargs["num_readers"] = spec["num_readers"]
    before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    d = TensorDeserializer(spec["path"], **kwargs)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    items = list(d.items())
    nbytes = sum(t.numel() * t.element_size() for _, t in items)
    # GPU memory beyond the tensors themselves (staging must stay on the host).
    extra = torch.cuda.max_memory_allocated() - before - nbytes
    fp, _, count = bl.fingerprint_state_dict([(k, v.cpu()) for k, v in items])
    d.close()
    return dict(seconds=dt, bytes=nbytes, tensors=count, fingerprint=fp, gpu_extra_bytes=extra)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--readers", default="1,4,8")
    ap.add_argument("--bench-dir", default=os.environ.get("TZ_BENCH_DIR", "/tmp/tz-bench"))
    ap.add_argument("--out", default=os.path.join(HERE, "out", "cuda.json"))
    bl.add_run_args(ap)
    args = ap.parse_args(argv)

    ours, upstream = bl.default_peers()
    probe = bl.run_worker(ours, dict(kind="probe"), 300, script=os.path.abspath(__file__))
    if not probe.get("ok") or not probe.get("cuda"):
        print("no CUDA device here: nothing to measure (this benchmark needs a GPU)")
        return 0

    lock, src, man = bl.open_checkpoint(args)  # noqa: F841 - lock held until exit
    paths = {}
    for peer in (ours, upstream):
        dst = os.path.join(args.bench_dir, f"cuda-{peer.name}.tensors")
        res = bl.run_worker(peer, dict(kind="save", impl=peer.name, src=src, dst=dst), args.timeout)
        if res.get("ok"):
            paths[peer.name] = dst
            bl.warm_page_cache(dst)
        else:
            print(f"  {peer.name} could not write its file: {res.get('error')}")

    readers = [int(r) for r in args.readers.split(",") if r]
    configs = [("h2d", "torch pinned host-to-device copy", ours,
                dict(kind="h2d", bytes=man["data_bytes"]))]
    for peer in (ours, upstream):
        if peer.name in paths:
            for n in readers:
                configs.append((f"{peer.name}.r{n}", f"{peer.name:<8} num_readers={n}", peer,
                                dict(kind="load_cuda", path=paths[peer.name], num_readers=n)))
    results = {key: [] for key, *_ in configs}
    me = os.path.abspath(__file__)
    for rep in range(args.repeats):
        for key, _, peer, spec in configs:
            res = bl.run_worker(peer, spec, args.timeout, script=me)
            results[key].append(res)
            bl._progress(key, rep, res)

    def best(key):
        return bl.best_of(results.get(key, []))

    h2d = best("h2d")
    print(f"\nhost: {probe.get('device')}; best of {args.repeats}; GB/s = 1e9 bytes per second")
    print(f"{'row':<40} {'seconds':>8} {'GB/s':>8} {'GPU extra MiB':>14}  data")
    best_rows = {}
    for key, label, peer, spec in configs:
        b = best(key)
        if b is None:
            errs = [r.get("error", "?") for r in results[key] if not r.get("ok")]
            print(f"{label:<40} FAILED: {(errs[-1] if errs else 'not run')[:100]}")
            continue
        gbps = b["bytes"] / b["seconds"] / GB
        extra = b.get("gpu_extra_bytes")
        ok = "" if key == "h2d" else ("ok" if b.get("fingerprint") == man["fingerprint"] else "MISMATCH")
        print(f"{label:<40} {b['seconds']:>8.3f} {gbps:>8.2f} "
              f"{'' if extra is None else f'{extra / 2**20:.0f}':>14}  {ok}")
        name = key.split(".")[0]
        if name != "h2d" and (name not in best_rows or b["seconds"] < best_rows[name]["seconds"]):
            best_rows[name] = b
    summary = {}
    if h2d and "ours" in best_rows:
        frac = h2d["seconds"] / best_rows["ours"]["seconds"]
        summary["ours_vs_pinned_h2d"] = frac
        print(f"\nours best / pinned H2D bandwidth: {frac:.0%} (target >= 70%: "
              f"{'PASS' if frac >= 0.7 else 'MISS'})")
    if "ours" in best_rows and "upstream" in best_rows:
        r = best_rows["upstream"]["seconds"] / best_rows["ours"]["seconds"]
        summary["ours_vs_upstream"] = r
        print(f"ours best / upstream best: {r:.2f}x")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(dict(results=results, summary=summary, manifest=man), f, indent=1)
    print(f"wrote {args.out}")
    return 0


def worker_probe(spec):
    import torch

    cuda = torch.cuda.is_available()
    return dict(cuda=cuda, device=torch.cuda.get_device_name() if cuda else None)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--worker":
        sys.exit(bl.serve_worker(sys.argv[2], {
            "probe": worker_probe, "h2d": worker_h2d, "load_cuda": worker_load_cuda,
            "save": bl.worker_save}))
    sys.exit(main())
