#!/usr/bin/env python3
"""S3 benchmark: loads from and saves to moto's S3 server on loopback, our tensorizer vs upstream 2.12.1 vs curl.

Run from the repository root (the driver needs .venv's boto3 and moto_server):

    .venv/bin/python bench/bench_s3.py [--size-gib 1.0] [--repeats 3] \
        [--out bench/out/s3.json] [--bench-dir /tmp/tz-bench]

Uses the same fp16 transformer-shaped checkpoint as bench_local.py (its
model.pt in the bench dir is reused).  Ours and upstream each write it to a
local .tensors file in a fresh temporary folder under /tmp (untimed), and the
driver uploads both with boto3 to a bucket of tests/servers.py's MotoS3 (moto's
S3 server on 127.0.0.1, keys "testing"/"testing").  Rows:

* ours: TensorDeserializer("s3://bucket/ours.tensors", num_readers=N,
  device="cpu", lazy_load=False) with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY
  and AWS_ENDPOINT_URL (the moto endpoint; plain http is allowed when it comes
  from the environment) in the worker's environment; N swept (default 1,2,4,8)
  plus the default num_readers;
* upstream: TensorDeserializer(open_stream("s3://bucket/upstream.tensors",
  "rb", s3_access_key_id=, s3_secret_access_key=, s3_endpoint=moto,
  force_http=True), num_readers=N, ...) on its own file (upstream presigns a
  GET URL with boto3 and runs the curl tool, one process per reader); N swept;
  open_stream is inside the timing;
* lazy (information): each peer's lazy_load=True load of its own object at the
  default num_readers, every tensor accessed once in file order;
* curl raw: `curl -s -o /dev/null URL` on a boto3 presigned GET URL of ours'
  object; and, for information, one 1 KiB ranged GET (moto's cost per request);
* saves: ours TensorSerializer("s3://bucket/ours-save.tensors") (streams a
  multipart upload), upstream TensorSerializer(open_stream("s3://...", "wb",
  ...credentials/endpoint..., force_http=True)) (a temporary file, uploaded
  with boto3 at close); write_state_dict + close are timed; the object is
  checked (its size against the peer's local file) and deleted afterwards.

moto is a Python server (werkzeug, one process): it may be the bottleneck for
every peer, and it answers each ranged GET by reading the whole object and
slicing it, so a client's request count matters far more than on real S3.

Same conventions as bench_local.py (whose helpers it imports): a fresh
subprocess per measurement, "ours" under $TZ_BENCH_OURS_PYTHON (default
.venv/bin/python with $TZ_BENCH_OURS_PYTHONPATH, default tz-python/, on
PYTHONPATH), "upstream" under $TZ_BENCH_UPSTREAM_PYTHON (default
.venv-upstream/bin/python), best-of-N with interleaved repeats, ratios between
peers of the same run, never asserts on timings.  moto is stopped and the
temporary folder deleted at the end.  This file is also its own worker
(`python bench_s3.py --worker JSON`); only the standard library is imported at
module level.
"""

import argparse
import functools
import os
import shutil
import signal
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
BUCKET = "tz-bench"
KEY_ID = SECRET = "testing"  # what MotoS3.client() uses; moto accepts any


# --------------------------------------------------------------------------
# Worker side
# --------------------------------------------------------------------------


_reset_peak_rss = bl.reset_peak_rss


def _open_upstream(spec, mode):
    """Upstream's way to a custom plain-http endpoint: explicit credentials,
    endpoint and force_http to its open_stream."""
    from tensorizer import stream_io

    return stream_io.open_stream(
        spec["uri"], mode, s3_access_key_id=KEY_ID, s3_secret_access_key=SECRET,
        s3_endpoint=spec["endpoint"], force_http=True)


def worker_load(spec):
    import torch  # noqa: F401  (imported before timing, like bench_local)

    kwargs = dict(device="cpu", lazy_load=bool(spec.get("lazy")))
    if spec.get("num_readers") is not None:
        kwargs["num_readers"] = spec["num_readers"]
    if spec["impl"] == "upstream":
        source = functools.partial(_open_upstream, spec, "rb")  # opened inside the timing
    else:
        source = spec["uri"]  # ours: credentials and endpoint from the environment
    return bl.timed_load(source, kwargs)


def worker_save(spec):
    import torch
    from tensorizer import TensorSerializer

    info = bl._tz_module_info()
    sd = torch.load(spec["src"], map_location="cpu", weights_only=True)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    hwm_reset = _reset_peak_rss()
    base = bl._current_rss_kib()
    t0 = time.perf_counter()
    if spec["impl"] == "upstream":
        s = TensorSerializer(_open_upstream(spec, "wb"))
    else:
        s = TensorSerializer(spec["uri"])
    s.write_state_dict(sd)
    s.close()
    dt = time.perf_counter() - t0
    peak = bl._peak_rss_kib()
    return dict(info, seconds=dt, bytes=nbytes, rss_base_kib=base,
                rss_peak_kib=peak, hwm_reset=hwm_reset)


def worker_curl(spec):
    """Times the curl tool downloading `url` to /dev/null (optionally one
    `range`), checking the HTTP status and byte count.  Peak RSS is curl's own
    ru_maxrss (os.wait4; on Linux it can include this small worker's RSS at
    spawn time, so it is an upper bound)."""
    cmd = [CURL, "-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download}"]
    want_code, want_size = "200", spec["size"]
    if spec.get("range"):
        a, b = spec["range"]
        cmd += ["-r", f"{a}-{b - 1}"]
        want_code, want_size = "206", b - a
    cmd.append(spec["url"])
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    out = p.stdout.read().decode(errors="replace").split()
    p.stdout.close()
    if p.returncode:
        raise RuntimeError(f"curl exit code {p.returncode}")
    if len(out) != 2 or out[0] != want_code:
        raise RuntimeError(f"curl got {out!r}, expected HTTP {want_code}")
    if int(out[1]) != want_size:
        raise RuntimeError(f"curl downloaded {out[1]} bytes, expected {want_size}")
    return dict(seconds=dt, bytes=want_size, rss_base_kib=0,
                rss_peak_kib=ru.ru_maxrss, curl=CURL)


def _honour_tmpdir(spec):
    tempfile.tempdir = None  # honour a TMPDIR from the spec


def worker_main(spec_json):
    return bl.serve_worker(spec_json, {"save_local": bl.worker_save, "save": worker_save, "load": worker_load, "curl": worker_curl}, before=_honour_tmpdir)


# --------------------------------------------------------------------------
# Driver side
# --------------------------------------------------------------------------


def run_worker(peer, spec, timeout):
    return bl.run_worker(peer, spec, timeout, script=os.path.abspath(__file__))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "out", "s3.json"))
    ap.add_argument("--bench-dir",
                    default=os.environ.get("TZ_BENCH_DIR", "/tmp/tz-bench"),
                    help="where bench_local.py's model.pt lives (and its lock)")
    ap.add_argument("--tmp-dir", default="/tmp",
                    help="parent of the temporary folder (local .tensors files, "
                         "upstream's save temp files)")
    ap.add_argument("--readers", default="1,2,4,8",
                    help="num_readers sweep (ours and upstream)")
    ap.add_argument("--keep-files", action="store_true",
                    help="keep the temporary folder (its path is printed)")
    bl.add_run_args(ap)
    args = ap.parse_args(argv)
    if args.worker is not None:
        return worker_main(args.worker)

    sweep = [int(x) for x in args.readers.split(",") if x.strip()]
    ncpu = os.cpu_count() or 1
    ours, upstream = bl.default_peers()
    rawp = bl.Peer("curl", sys.executable, None)  # stdlib only

    lock, src, man = bl.open_checkpoint(args)  # noqa: F841 - lock held until exit

    sys.path.insert(0, os.path.join(REPO, "tests"))
    import servers  # tests/servers.py: stdlib only at import

    tmp = tempfile.mkdtemp(prefix="tz-bench-s3-", dir=args.tmp_dir)
    print(f"[setup] temporary folder {tmp}", flush=True)
    t_start = time.perf_counter()
    # A SIGTERM (or SIGHUP) unwinds like Ctrl-C, so the `finally` below and
    # MotoS3's __exit__ still stop moto and delete the folder (subprocess.run
    # kills a running worker on the way out).
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    try:
        # MotoS3 runs moto_server next to sys.executable (.venv/bin/).
        with servers.MotoS3() as moto:
            return _run(args, sweep, ncpu, ours, upstream, rawp, src, man, moto,
                        tmp, t_start)
    finally:
        # moto is stopped by now (the context manager), its objects with it.
        if args.keep_files:
            print(f"[cleanup] kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _versions():
    from importlib import metadata

    out = {}
    for dist in ("moto", "boto3", "botocore", "werkzeug"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    try:
        p = subprocess.run([CURL, "--version"], capture_output=True, text=True,
                           timeout=10)
        out["curl"] = p.stdout.split()[1] if p.stdout else None
    except (OSError, subprocess.SubprocessError, IndexError):
        out["curl"] = None
    return out


def _run(args, sweep, ncpu, ours, upstream, rawp, src, man, moto, tmp, t_start):
    data_bytes = man["data_bytes"]
    ref_fp = man["fingerprint"]
    versions = _versions()
    endpoint = moto.endpoint
    print(f"[setup] moto {versions['moto']} S3 server at {endpoint}", flush=True)
    client = moto.client()
    client.create_bucket(Bucket=BUCKET)
    # Every worker gets the credentials and endpoint in its environment (what
    # ours reads; upstream is also given them explicitly), and TMPDIR inside
    # our folder so upstream's save temp files are removed with it.
    env = dict(AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET,
               AWS_ENDPOINT_URL=endpoint, AWS_DEFAULT_REGION="us-east-1",
               TMPDIR=tmp)

    # ---- setup: each peer writes its file locally, boto3 uploads it --------
    results = {}
    local = {"ours": os.path.join(tmp, "ours.tensors"),
             "upstream": os.path.join(tmp, "upstream.tensors")}
    keys = {"ours": "ours.tensors", "upstream": "upstream.tensors"}
    uploaded = {}
    bl.warm_page_cache(src)
    for peer in (ours, upstream):
        dst = local[peer.name]
        res = run_worker(peer, dict(kind="save_local", impl=peer.name, src=src,
                                    dst=dst),
                         args.timeout)
        results[f"setup.save.{peer.name}"] = [res]
        bl._progress(f"setup.save.{peer.name}", 0, res)
        if not res.get("ok"):
            continue
        t0 = time.perf_counter()
        try:
            client.upload_file(dst, BUCKET, keys[peer.name])
        except Exception as e:  # noqa: BLE001  (report and go on)
            print(f"  upload of {keys[peer.name]} FAILED: {type(e).__name__}: {e}",
                  flush=True)
            continue
        uploaded[peer.name] = os.path.getsize(dst)
        print(f"  uploaded {keys[peer.name]} ({uploaded[peer.name] / MiB:.0f} MiB) "
              f"with boto3 in {time.perf_counter() - t0:.1f}s", flush=True)
    size_ours = uploaded.get("ours")
    url_ours = None
    if size_ours is not None:
        url_ours = client.generate_presigned_url(
            "get_object", Params={"Bucket": BUCKET, "Key": keys["ours"]},
            ExpiresIn=7 * 24 * 3600)

    def s3uri(key):
        return f"s3://{BUCKET}/{key}"

    def load(key, label, peer, **kw):
        spec = dict(kind="load", impl=peer.name, uri=s3uri(keys[peer.name]),
                    endpoint=endpoint, env=env, **kw)
        return (key, label, peer, spec)

    # ---- configs: loads, curl, saves; interleaved repeats -------------------
    configs = [load("load.ours.default", "ours     (default readers)", ours)]
    for n in sweep:
        configs.append(load(f"load.ours.r{n}", f"ours     num_readers={n}", ours,
                            num_readers=n))
    for n in sweep:
        configs.append(load(f"load.upstream.r{n}", f"upstream num_readers={n}",
                            upstream, num_readers=n))
    # Lazy loads read a tensor per access, here in file order (information).
    configs.append(load("load.ours.lazy", "ours     lazy_load=True (info)", ours, lazy=True))
    configs.append(load("load.upstream.lazy", "upstream lazy_load=True (info)", upstream,
                        lazy=True))
    configs.append(("curl.r1", "curl     -s -o /dev/null <presigned URL>", rawp,
                    dict(kind="curl", url=url_ours, size=size_ours)))
    configs.append(("curl.range1k", "curl     -r 0-1023 (one request, info)", rawp,
                    dict(kind="curl", url=url_ours, size=size_ours,
                         range=[0, 1024])))
    save_keys = {}
    for peer, how in ((ours, "streaming multipart"),
                      (upstream, "temp file + boto3 upload")):
        k = f"save.{peer.name}"
        save_keys[k] = (peer.name, f"{peer.name}-save.tensors")
        configs.append((k, f"save {peer.name:<8} ({how})", peer,
                        dict(kind="save", impl=peer.name, src=src,
                             uri=s3uri(save_keys[k][1]), endpoint=endpoint,
                             env=env)))
    labels = {k: lbl for k, lbl, *_ in configs}
    for k, *_ in configs:
        results[k] = []
    object_bytes = {k: [] for k in save_keys}

    def needs(peer_name):
        return uploaded.get(peer_name) is not None

    print(f"[run] {len(configs)} configs x {args.repeats} repeats "
          "(moto is slow: minutes per ours load at 1 GiB)", flush=True)
    for r in range(args.repeats):
        for key, label, peer, spec in configs:
            obj = None
            if key.startswith("load.") and not needs(peer.name):
                res = {"ok": False, "error": f"no object {keys[peer.name]} "
                       "(its save or upload failed)"}
            elif key.startswith("curl.") and url_ours is None:
                res = {"ok": False, "error": "no object ours.tensors"}
            else:
                if key.startswith("save."):
                    bl.warm_page_cache(src)
                res = run_worker(peer, spec, args.timeout)
            if key in save_keys:
                obj = save_keys[key][1]
                try:
                    size = client.head_object(Bucket=BUCKET, Key=obj)["ContentLength"]
                except Exception:  # noqa: BLE001  (absent after a failed save)
                    size = None
                if res.get("ok"):
                    res["object_bytes"] = size
                    object_bytes[key].append(size)
                try:
                    client.delete_object(Bucket=BUCKET, Key=obj)
                except Exception:  # noqa: BLE001
                    pass
            results[key].append(res)
            bl._progress(key, r, res)

    best = {k: bl.best_of(v) for k, v in results.items()}

    def best_group(keys_):
        c = [(k, best[k]) for k in keys_ if best.get(k)]
        return min(c, key=lambda kv: kv[1]["seconds"]) if c else (None, None)

    ours_keys = ["load.ours.default"] + [f"load.ours.r{n}" for n in sweep]
    up_keys = [f"load.upstream.r{n}" for n in sweep]
    ok_key, ok_best = best_group(ours_keys)
    up_key, up_best = best_group(up_keys)

    # ---- ratios ------------------------------------------------------------
    # Throughputs (bytes/s): the curl row counts the object's bytes, the loads
    # and saves the tensor data.
    tput_ratio = bl.throughput_ratio

    ratios = []

    def add_ratio(name, value, target, note):
        ratios.append(bl.target_row(name, value, target, note))

    curl1 = best.get("curl.r1")
    add_ratio("load ours-best / upstream-best", tput_ratio(ok_best, up_best), 2.0,
              f"{ok_key} vs {up_key}")
    add_ratio("load ours-best / curl raw", tput_ratio(ok_best, curl1), 0.80,
              f"{ok_key} vs one `curl -s -o /dev/null` of a presigned URL")
    add_ratio("save ours / upstream", tput_ratio(best.get("save.ours"),
                                                 best.get("save.upstream")), 2.0,
              "write_state_dict + close (upload included)")
    ratios.append(bl.rss_target("load ours peak RSS delta", ok_best, data_bytes, ok_key))

    # ---- print -------------------------------------------------------------
    info_ours = bl.first_info(results, ours_keys + ["save.ours", "setup.save.ours"])
    info_up = bl.first_info(results, up_keys + ["save.upstream", "setup.save.upstream"])
    elapsed = time.perf_counter() - t_start
    print()
    print(f"checkpoint: {man['tensors']} fp16 tensors, {data_bytes / GiB:.3f} GiB data "
          f"(d={man['hidden']}, layers={man['layers']}, vocab={man['vocab']}); "
          f"objects: ours {_mib(uploaded.get('ours'))}, "
          f"upstream {_mib(uploaded.get('upstream'))}")
    print(f"ours:     {ours.python}  tensorizer {info_ours.get('version')} "
          f"from {info_ours.get('module')}")
    print(f"upstream: {upstream.python}  tensorizer {info_up.get('version')} "
          f"from {info_up.get('module')}")
    print(f"server: moto {versions['moto']} (werkzeug {versions['werkzeug']}) S3 on "
          f"{endpoint}; boto3 {versions['boto3']}; client: curl {versions['curl']}")
    print("NOTE: moto is a Python server (one process, GIL) and may be the "
          "bottleneck for every peer;")
    print("      it answers each ranged GET by reading the whole object, so the "
          "cost per request grows with the object, not the range.")
    print(f"host: {ncpu} CPUs; best of {args.repeats}; GB/s = 1e9 bytes of tensor "
          "data (curl: of the object) per second; cold (fresh process); "
          f"total {elapsed / 60:.1f} min")
    print("dRSS/peak: workers reset their peak RSS (clear_refs) just before timing; "
          "upstream's curl children and moto are not counted")
    cols = 44
    print()
    print(f"{'row':<{cols}}  {'seconds':>8}  {'GB/s':>7}  {'dRSS MiB':>9}  "
          f"{'peak MiB':>9}  data")
    print("-" * (cols + 50))
    for key, *_ in configs:
        if key == "curl.range1k":
            continue  # printed as a note below
        # Three decimals of GB/s: moto's rows are slow.
        line = bl.fmt_row(labels[key], best[key], results[key], None,
                          ref_fp if key.startswith("load.") else None, cols, gbs_decimals=3)
        if key in save_keys and best[key] is not None:
            want = uploaded.get(save_keys[key][0])
            got = best[key].get("object_bytes")
            line += ("object ok" if got is not None and got == want else
                     f"object {got} bytes, local file {want}")
        if key in (ok_key, up_key):
            line += f"  <- best {'ours' if key == ok_key else 'upstream'}"
        print(line)
    rq = best.get("curl.range1k")
    if rq is not None:
        print(f"\nmoto per-request cost: one 1 KiB ranged GET of the "
              f"{_mib(size_ours)} object took {rq['seconds']:.3f} s (curl start "
              "included)")
        per = rq["seconds"]
        parts = [f"{name} best load = {b['seconds'] / per:.1f}x that"
                 for name, b in (("ours", ok_best), ("upstream", up_best)) if b]
        if parts:
            print("  " + ", ".join(parts) + " (roughly how many requests moto "
                  "served one after another)")
    print()
    bl.print_targets(ratios, best, results, ref_fp)

    bl.write_report(args.out, args, man, (ours, upstream), (info_ours, info_up), best, ref_fp,
                    ratios, results, objects=dict(uploaded),
                    server=dict(endpoint=endpoint, bucket=BUCKET, **versions),
                    note=("moto is a Python server and may be the bottleneck for every peer; "
                          "it reads the whole object for each ranged GET"),
                    elapsed_seconds=elapsed, best_ours_load=ok_key, best_upstream_load=up_key)
    return 0


def _mib(n):
    return "missing" if n is None else f"{n / MiB:.0f} MiB"


if __name__ == "__main__":
    sys.exit(main())
