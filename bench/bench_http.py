#!/usr/bin/env python3
"""HTTP benchmark: loading from nginx on loopback, our tensorizer vs upstream 2.12.1 vs curl.

Run from the repository root:

    .venv/bin/python bench/bench_http.py [--size-gib 1.0] [--repeats 3] \
        [--out bench/out/http.json] [--bench-dir /tmp/tz-bench]

Uses the same fp16 transformer-shaped checkpoint as bench_local.py (its
model.pt in the bench dir is reused).  Ours and upstream each write it to a
.tensors file in a fresh temporary folder under /tmp, which tests/servers.py's
Nginx serves on 127.0.0.1 (sendfile on; page cache warmed before each
measurement).  Rows:

* ours: TensorDeserializer(url, num_readers=N, device="cpu", lazy_load=False),
  N swept (default 1,2,4,8,16) plus the default num_readers; then, at ours'
  best setting, verify_hash=True and the same load of upstream's file;
* upstream: the same call on its own file (it runs the curl tool, one process
  per reader), N swept; then verify_hash=True at its best N;
* lazy (information): each peer's lazy_load=True load of its own file at the
  default num_readers, every tensor accessed once in file order;
* curl raw: `curl -s -o /dev/null URL` on ours' file, and the same file as N
  parallel ranged requests (`curl -r a-b`, one process each) for each N.

Same conventions as bench_local.py (whose helpers it imports): a fresh
subprocess per measurement, "ours" under $TZ_BENCH_OURS_PYTHON (default
.venv/bin/python with $TZ_BENCH_OURS_PYTHONPATH, default tz-python/, on
PYTHONPATH), "upstream" under $TZ_BENCH_UPSTREAM_PYTHON (default
.venv-upstream/bin/python), best-of-N with interleaved repeats, ratios between
peers of the same run, never asserts on timings.  nginx is stopped and the
temporary folder deleted at the end.  This file is also its own worker
(`python bench_http.py --worker JSON`); only the standard library is imported
at module level.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import bench_local as bl  # noqa: E402  (stdlib-only at import, same directory)

REPO = bl.REPO
RESULT_TAG = bl.RESULT_TAG
MiB = bl.MiB
GiB = bl.GiB
CURL = shutil.which("curl") or "/usr/bin/curl"


# --------------------------------------------------------------------------
# Worker side
# --------------------------------------------------------------------------


def worker_load(spec):
    import torch  # noqa: F401  (imported before timing, like bench_local)

    kwargs = dict(device="cpu", lazy_load=bool(spec.get("lazy")))
    if spec.get("num_readers") is not None:
        kwargs["num_readers"] = spec["num_readers"]
    if spec.get("verify_hash"):
        kwargs["verify_hash"] = True
    return bl.timed_load(spec["url"], kwargs, spec.get("prewarm_mib"))


def worker_curl(spec):
    """Times the curl tool downloading `url` (`size` bytes) to /dev/null, as one
    request or as `parallel` concurrent ranged requests (one curl each).  Peak
    RSS is the sum over the curl processes of their own ru_maxrss (os.wait4);
    on Linux that also counts this small worker's RSS at spawn time, so it is
    an upper bound."""
    url, size, n = spec["url"], spec["size"], max(1, spec.get("parallel", 1))
    cmds = []
    if n == 1:
        cmds.append([CURL, "-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download}",
                     url])
    else:
        bounds = [size * j // n for j in range(n + 1)]
        for j in range(n):
            cmds.append([CURL, "-s", "-o", "/dev/null", "-w",
                         "%{http_code} %{size_download}",
                         "-r", f"{bounds[j]}-{bounds[j + 1] - 1}", url])
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
             for c in cmds]
    rss = 0
    codes = []
    for p in procs:
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        rss += ru.ru_maxrss
    dt = time.perf_counter() - t0
    got = 0
    for p in procs:
        out = p.stdout.read().decode(errors="replace").split()
        p.stdout.close()
        codes.append(p.returncode)
        if len(out) == 2:
            got += int(out[1])
            want = "200" if n == 1 else "206"
            if out[0] != want:
                raise RuntimeError(f"curl got HTTP {out[0]}, expected {want}")
    if any(codes):
        raise RuntimeError(f"curl exit codes {codes}")
    if got != size:
        raise RuntimeError(f"curl downloaded {got} bytes, expected {size}")
    return dict(
        seconds=dt,
        bytes=size,
        processes=n,
        rss_base_kib=0,
        rss_peak_kib=rss,
        curl=CURL,
    )


def worker_main(spec_json):
    return bl.serve_worker(spec_json, {"save": bl.worker_save, "load": worker_load, "curl": worker_curl})


# --------------------------------------------------------------------------
# Driver side
# --------------------------------------------------------------------------


def run_worker(peer, spec, timeout):
    return bl.run_worker(peer, spec, timeout, script=os.path.abspath(__file__))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "out", "http.json"))
    ap.add_argument("--bench-dir",
                    default=os.environ.get("TZ_BENCH_DIR", "/tmp/tz-bench"),
                    help="where bench_local.py's model.pt lives (and its lock)")
    ap.add_argument("--tmp-dir", default="/tmp",
                    help="parent of the temporary folder nginx serves")
    ap.add_argument("--readers", default="1,2,4,8,16",
                    help="num_readers sweep (ours and upstream), also the curl "
                         "parallel-range counts")
    ap.add_argument("--prewarm-mib", type=int, default=0,
                    help="touch and release this much memory in each load worker"
                         " before timing (steady-state rather than cold figures)")
    ap.add_argument("--keep-files", action="store_true",
                    help="keep the served folder (its path is printed)")
    bl.add_run_args(ap)
    args = ap.parse_args(argv)
    if args.worker is not None:
        return worker_main(args.worker)

    sweep = [int(x) for x in args.readers.split(",") if x.strip()]
    ncpu = os.cpu_count() or 1
    ours, upstream = bl.default_peers()
    rawp = bl.Peer("curl", sys.executable, None)  # stdlib only

    lock, src, man = bl.open_checkpoint(args)  # noqa: F841 - lock held until exit
    data_bytes = man["data_bytes"]
    ref_fp = man["fingerprint"]

    sys.path.insert(0, os.path.join(REPO, "tests"))
    import pathlib

    import servers  # tests/servers.py: stdlib only

    tmp = tempfile.mkdtemp(prefix="tz-bench-http-", dir=args.tmp_dir)
    www = os.path.join(tmp, "www")
    os.makedirs(www)
    f_ours = os.path.join(www, "ours.tensors")
    f_up = os.path.join(www, "upstream.tensors")
    print(f"[setup] serving {www}", flush=True)
    try:
        with servers.Nginx(pathlib.Path(www), pathlib.Path(tmp) / "nginx") as nginx:
            return _run(args, sweep, ncpu, ours, upstream, rawp, src, man,
                        data_bytes, ref_fp, nginx, f_ours, f_up)
    finally:
        # nginx is stopped by now (the context manager); drop the big files.
        if args.keep_files:
            print(f"[cleanup] kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _run(args, sweep, ncpu, ours, upstream, rawp, src, man, data_bytes, ref_fp,
         nginx, f_ours, f_up):
    u_ours = nginx.url(os.path.basename(f_ours))
    u_up = nginx.url(os.path.basename(f_up))
    print(f"[setup] nginx {servers_version()} on 127.0.0.1:{nginx.port}", flush=True)

    # ---- saves: each peer writes the file it will load (once, untimed rows) --
    results = {}
    bl.warm_page_cache(src)
    for key, peer, dst in (("save.ours", ours, f_ours), ("save.upstream", upstream, f_up)):
        res = run_worker(peer, dict(kind="save", impl=peer.name, src=src, dst=dst),
                         args.timeout)
        results[key] = [res]
        bl._progress(key, 0, res)
        if not res.get("ok") and os.path.exists(dst):
            os.unlink(dst)
    size_ours = os.path.getsize(f_ours) if os.path.exists(f_ours) else None

    def load(key, label, peer, path, url, **kw):
        spec = dict(kind="load", url=url, prewarm_mib=args.prewarm_mib, **kw)
        return (key, label, peer, path, spec)

    # ---- phase A: sweeps + curl, interleaved repeats -----------------------
    phase_a = [load("load.ours.default", "ours     (default readers)", ours,
                    f_ours, u_ours)]
    for n in sweep:
        phase_a.append(load(f"load.ours.r{n}", f"ours     num_readers={n}", ours,
                            f_ours, u_ours, num_readers=n))
    for n in sweep:
        phase_a.append(load(f"load.upstream.r{n}", f"upstream num_readers={n}",
                            upstream, f_up, u_up, num_readers=n))
    phase_a.append(("curl.r1", "curl     -s -o /dev/null URL", rawp, f_ours,
                    dict(kind="curl", url=u_ours, size=size_ours, parallel=1)))
    for n in sweep:
        if n > 1:
            phase_a.append((f"curl.r{n}", f"curl     {n} parallel ranges", rawp,
                            f_ours, dict(kind="curl", url=u_ours, size=size_ours,
                                         parallel=n)))
    labels = {k: lbl for k, lbl, *_ in phase_a}
    for k, *_ in phase_a:
        results[k] = []

    def run_configs(configs, r):
        for key, label, peer, path, spec in configs:
            if not os.path.exists(path):
                res = {"ok": False, "error": f"no file {os.path.basename(path)} "
                       "(its save failed)"}
            else:
                bl.warm_page_cache(path)
                res = run_worker(peer, spec, args.timeout)
            results[key].append(res)
            bl._progress(key, r, res)

    print(f"[run] phase A: {len(phase_a)} configs x {args.repeats} repeats", flush=True)
    for r in range(args.repeats):
        run_configs(phase_a, r)

    best = {k: bl.best_of(v) for k, v in results.items()}

    def best_group(keys_):
        c = [(k, best[k]) for k in keys_ if best.get(k)]
        return min(c, key=lambda kv: kv[1]["seconds"]) if c else (None, None)

    ours_keys = ["load.ours.default"] + [f"load.ours.r{n}" for n in sweep]
    ok_key, ok_best = best_group(ours_keys)
    up_key, up_best = best_group([f"load.upstream.r{n}" for n in sweep])
    ours_n = None if ok_key in (None, "load.ours.default") else int(ok_key.rsplit("r", 1)[1])
    up_n = None if up_key is None else int(up_key.rsplit("r", 1)[1])
    ours_n_lbl = "default readers" if ours_n is None else f"num_readers={ours_n}"

    # ---- phase B: verify_hash and the cross-file load at each peer's best N --
    phase_b = [
        load("load.ours.verify", f"ours     verify_hash, {ours_n_lbl}", ours, f_ours,
             u_ours, num_readers=ours_n, verify_hash=True),
        load("load.ours.upfile", f"ours     upstream's file, {ours_n_lbl}", ours,
             f_up, u_up, num_readers=ours_n),
        # Lazy loads read a tensor per access, here in file order (information).
        load("load.ours.lazy", "ours     lazy_load=True (info)", ours, f_ours, u_ours,
             lazy=True),
        load("load.upstream.lazy", "upstream lazy_load=True (info)", upstream, f_up,
             u_up, lazy=True),
    ]
    if up_n is not None:
        phase_b.append(load("load.upstream.verify",
                            f"upstream verify_hash, num_readers={up_n}", upstream,
                            f_up, u_up, num_readers=up_n, verify_hash=True))
    for k, lbl, *_ in phase_b:
        labels[k] = lbl
        results[k] = []
    print(f"[run] phase B: {len(phase_b)} configs x {args.repeats} repeats "
          f"(ours at {ours_n_lbl}, upstream at num_readers={up_n})", flush=True)
    for r in range(args.repeats):
        run_configs(phase_b, r)
    for k, *_ in phase_b:
        best[k] = bl.best_of(results[k])

    # ---- ratios ------------------------------------------------------------
    # Throughputs (bytes/s): the curl rows count the file's bytes, the loads the
    # tensor data, which is ~all of the file.
    tput_ratio = bl.throughput_ratio

    curl1 = best.get("curl.r1")
    curl_same_key = None if ours_n in (None, 1) else f"curl.r{ours_n}"
    curl_same = curl1 if ours_n in (None, 1) else best.get(curl_same_key)
    curl_key, curl_best = best_group(["curl.r1"] + [f"curl.r{n}" for n in sweep if n > 1])
    ratios = []

    def add_ratio(name, value, target, note):
        ratios.append(bl.target_row(name, value, target, note))

    add_ratio("load ours-best / upstream-best", tput_ratio(ok_best, up_best), 2.0,
              f"{ok_key} vs {up_key}")
    add_ratio("load ours-best / curl raw", tput_ratio(ok_best, curl1), 0.80,
              f"{ok_key} vs one `curl -s -o /dev/null`")
    add_ratio("verify ours / upstream", tput_ratio(best.get("load.ours.verify"),
                                                    best.get("load.upstream.verify")),
              None, "verify_hash=True at each peer's best N (info)")
    add_ratio("load ours-best / curl same N", tput_ratio(ok_best, curl_same), None,
              f"vs {curl_same_key or 'curl.r1'} (info)")
    add_ratio("load ours-best / curl best", tput_ratio(ok_best, curl_best), None,
              f"vs {curl_key} (info)")
    ratios.append(bl.rss_target("load ours peak RSS delta", ok_best, data_bytes, ok_key))

    # ---- print -------------------------------------------------------------
    info_ours = bl.first_info(results, ours_keys + ["save.ours"])
    info_up = bl.first_info(results, [f"load.upstream.r{n}" for n in sweep] + ["save.upstream"])
    print()
    print(f"checkpoint: {man['tensors']} fp16 tensors, {data_bytes / GiB:.3f} GiB data "
          f"(d={man['hidden']}, layers={man['layers']}, vocab={man['vocab']}); "
          f"files: ours {_size(f_ours)}, upstream {_size(f_up)}")
    print(f"ours:     {ours.python}  tensorizer {info_ours.get('version')} "
          f"from {info_ours.get('module')}")
    print(f"upstream: {upstream.python}  tensorizer {info_up.get('version')} "
          f"from {info_up.get('module')}")
    print(f"server: nginx on 127.0.0.1 (sendfile, 2 workers), files in page cache; "
          f"client: {CURL}")
    mode = (f"{args.prewarm_mib} MiB pre-touched before timing" if args.prewarm_mib
            else "cold (fresh process)")
    print(f"host: {ncpu} CPUs; best of {args.repeats}; GB/s = 1e9 bytes of tensor "
          f"data (curl: of the file) per second; {mode}")
    print("dRSS/peak: loads reset their peak RSS (clear_refs) just before timing; "
          "curl rows: sum of the curl processes' peaks (upper bound)")
    cols = 44
    print()
    print(f"{'row':<{cols}}  {'seconds':>8}  {'GB/s':>7}  {'dRSS MiB':>9}  "
          f"{'peak MiB':>9}  data")
    print("-" * (cols + 50))
    order = [k for k, *_ in phase_a[:len(sweep) + 1]] + [k for k, *_ in phase_b[:2]] \
        + [k for k, *_ in phase_a[len(sweep) + 1:2 * len(sweep) + 1]] \
        + [k for k, *_ in phase_b[2:]] + [k for k, *_ in phase_a[2 * len(sweep) + 1:]]
    for key in order:
        line = bl.fmt_row(labels[key], best[key], results[key], data_bytes,
                          ref_fp if key.startswith("load.") else None, cols)
        if key in (ok_key, up_key):
            line += f"  <- best {'ours' if key == ok_key else 'upstream'}"
        if key == curl_key:
            line += "  <- best curl"
        print(line)
    print()
    bl.print_targets(ratios, best, results, ref_fp)

    bl.write_report(args.out, args, man, (ours, upstream), (info_ours, info_up), best, ref_fp,
                    ratios, results,
                    files=dict(ours=_size_bytes(f_ours), upstream=_size_bytes(f_up)),
                    server=dict(nginx=servers_version(), port=nginx.port, curl=CURL),
                    best_ours_load=ok_key, best_upstream_load=up_key, best_curl=curl_key)
    return 0


def _size_bytes(path):
    return os.path.getsize(path) if os.path.exists(path) else None


def _size(path):
    n = _size_bytes(path)
    return "missing" if n is None else f"{n / MiB:.0f} MiB"


def servers_version():
    import servers

    try:
        p = subprocess.run([servers.NGINX, "-v"], capture_output=True, text=True,
                           timeout=10)
        return (p.stderr or p.stdout).strip().split("/")[-1] or None
    except (OSError, subprocess.SubprocessError):
        return None


if __name__ == "__main__":
    sys.exit(main())
