#!/usr/bin/env python3
"""Encryption benchmark: our tensorizer vs upstream tensorizer 2.12.1, plus raw libsodium.

Run from the repository root:

    .venv/bin/python bench/bench_crypto.py [--size-gib 1.0] [--repeats 3] \
        [--out bench/out/crypto.json] [--bench-dir /tmp/tz-bench]

Measures, on the same fp16 transformer-shaped checkpoint as bench_local.py:

* encrypted save: TensorSerializer(path, encryption=EncryptionParams.random()),
  write_state_dict, close -- ours vs upstream;
* encrypted load: TensorDeserializer(path, encryption=DecryptionParams.from_key(k),
  device="cpu", lazy_load=False), verify_hash off and on, upstream swept over
  num_readers; each peer reads the file it wrote, plus ours reading upstream's
  file; "cold" (fresh process) and "steady" (memory pre-touched) modes;
* the libsodium limit: crypto_secretbox_open_detached over the same number of
  bytes in 2 MiB boxes (sealed first with crypto_secretbox_detached, opened in
  place, memory already touched), with 1 thread and os.cpu_count() threads,
  called through ctypes (which drops the GIL during the call);
* our plain (unencrypted) load of the same model, for context.

Same conventions as bench_local.py (whose helpers it imports): a fresh
subprocess per measurement, "ours" under $TZ_BENCH_OURS_PYTHON (default
.venv/bin/python with $TZ_BENCH_OURS_PYTHONPATH, default tz-python/, on
PYTHONPATH), "upstream" under $TZ_BENCH_UPSTREAM_PYTHON (default
.venv-upstream/bin/python), best-of-N, ratios between peers of the same run,
never asserts on timings.  This file is also its own worker
(`python bench_crypto.py --worker JSON`); only the standard library is
imported at module level.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import bench_local as bl  # noqa: E402  (stdlib-only at import, same directory)

REPO = bl.REPO
RESULT_TAG = bl.RESULT_TAG
MiB = bl.MiB
GiB = bl.GiB
SODIUM_SONAME = "libsodium.so.23"


# --------------------------------------------------------------------------
# Worker side
# --------------------------------------------------------------------------


_reset_peak_rss = bl.reset_peak_rss


def worker_save(spec):
    import torch
    from tensorizer import TensorSerializer

    info = bl._tz_module_info()
    enc = None
    if spec.get("encrypt"):
        from tensorizer import EncryptionParams

        enc = EncryptionParams.random()
    sd = torch.load(spec["src"], map_location="cpu", weights_only=True)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    dst = spec["dst"]
    if os.path.exists(dst):
        os.unlink(dst)
    hwm_reset = _reset_peak_rss()
    base = bl._current_rss_kib()
    t0 = time.perf_counter()
    if enc is not None:
        s = TensorSerializer(dst, encryption=enc)
    else:
        s = TensorSerializer(dst)
    s.write_state_dict(sd)
    s.close()
    dt = time.perf_counter() - t0
    peak = bl._peak_rss_kib()
    return dict(
        info,
        seconds=dt,
        bytes=nbytes,
        file_bytes=os.path.getsize(dst),
        rss_base_kib=base,
        rss_peak_kib=peak,
        hwm_reset=hwm_reset,
        # A throwaway benchmark key: the driver hands it to the load workers.
        key=None if enc is None else bytes(enc.key).hex(),
    )


def worker_load(spec):
    import torch  # noqa: F401  (imported before timing, like bench_local)

    kwargs = dict(device="cpu", lazy_load=False)
    if spec.get("key"):
        from tensorizer import DecryptionParams

        kwargs["encryption"] = DecryptionParams.from_key(bytes.fromhex(spec["key"]))
    if spec.get("num_readers") is not None:
        kwargs["num_readers"] = spec["num_readers"]
    if spec.get("verify_hash"):
        kwargs["verify_hash"] = True
    return bl.timed_load(spec["path"], kwargs, spec.get("prewarm_mib"))


def _load_sodium():
    import ctypes
    import ctypes.util

    try:
        lib = ctypes.CDLL(SODIUM_SONAME)
    except OSError:
        name = ctypes.util.find_library("sodium")
        if not name:
            raise
        lib = ctypes.CDLL(name)
    if lib.sodium_init() < 0:
        raise RuntimeError("sodium_init() failed")
    vp, ull = ctypes.c_void_p, ctypes.c_ulonglong
    for fn in ("crypto_secretbox_detached", "crypto_secretbox_open_detached"):
        f = getattr(lib, fn)
        f.argtypes = [vp, vp, vp, ull, vp, vp]
        f.restype = ctypes.c_int
    lib.sodium_version_string.restype = ctypes.c_char_p
    return lib


def worker_secretbox(spec):
    """Raw libsodium secretbox throughput on `bytes` bytes in `box` byte boxes.

    The buffer is sealed in place box by box (crypto_secretbox_detached, one
    nonce per box, MACs kept aside), then opened in place with
    crypto_secretbox_open_detached -- which checks the MAC over the whole box
    and then decrypts it, as a load must.  Only the open is the figure of
    interest; the seal is timed too (information: the limit for saves).
    Threads take contiguous ranges of boxes; ctypes releases the GIL for each
    call.  Best of `passes` per thread count; the buffer is resealed before
    each timed open."""
    import ctypes
    import threading

    lib = _load_sodium()
    nbytes, box = spec["bytes"], spec["box"]
    nboxes = (nbytes + box - 1) // box
    buf = (ctypes.c_ubyte * nbytes)()
    base_addr = ctypes.addressof(buf)
    nonces = (ctypes.c_ubyte * (24 * nboxes)).from_buffer_copy(os.urandom(24 * nboxes))
    macs = (ctypes.c_ubyte * (16 * nboxes))()
    key = (ctypes.c_ubyte * 32).from_buffer_copy(os.urandom(32))
    n_addr, m_addr, k_addr = (ctypes.addressof(x) for x in (nonces, macs, key))
    seal_fn = lib.crypto_secretbox_detached
    open_fn = lib.crypto_secretbox_open_detached

    def seal_range(lo, hi, fails):
        for i in range(lo, hi):
            p = base_addr + i * box
            n = min(box, nbytes - i * box)
            if seal_fn(p, m_addr + 16 * i, p, n, n_addr + 24 * i, k_addr) != 0:
                fails.append(i)

    def open_range(lo, hi, fails):
        for i in range(lo, hi):
            p = base_addr + i * box
            n = min(box, nbytes - i * box)
            if open_fn(p, p, m_addr + 16 * i, n, n_addr + 24 * i, k_addr) != 0:
                fails.append(i)

    def timed(fn, nthreads):
        fails = []
        bounds = [nboxes * j // nthreads for j in range(nthreads + 1)]
        barrier = threading.Barrier(nthreads + 1)

        def body(lo, hi):
            barrier.wait()
            fn(lo, hi, fails)

        ts = [threading.Thread(target=body, args=(bounds[j], bounds[j + 1]))
              for j in range(nthreads)]
        for t in ts:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in ts:
            t.join()
        return time.perf_counter() - t0, len(fails)

    threads = spec["threads"]
    maxt = max(threads)
    # Touch the whole buffer once (first seal, untimed) so no timed pass pays
    # for first-touch page faults.
    timed(seal_range, maxt)
    base = bl._current_rss_kib()
    out = {}
    for nt in threads:
        best_open = best_seal = None
        open_fails = seal_fails = 0
        for _ in range(spec["passes"]):
            # Back to plaintext is not needed: sealing the current content
            # (whatever it is) gives valid boxes; time that seal, then open.
            ts, sf = timed(seal_range, nt)
            to, of = timed(open_range, nt)
            seal_fails += sf
            open_fails += of
            best_seal = ts if best_seal is None else min(best_seal, ts)
            best_open = to if best_open is None else min(best_open, to)
        out[str(nt)] = dict(open_seconds=best_open, seal_seconds=best_seal,
                            open_failures=open_fails, seal_failures=seal_fails)
    peak = bl._peak_rss_kib()
    return dict(
        sodium_version=lib.sodium_version_string().decode(),
        bytes=nbytes,
        box=box,
        boxes=nboxes,
        by_threads=out,
        rss_base_kib=base,
        rss_peak_kib=peak,
        seconds=min(v["open_seconds"] for v in out.values()),
    )


def worker_main(spec_json):
    return bl.serve_worker(spec_json, {"save": worker_save, "load": worker_load, "secretbox": worker_secretbox})


# --------------------------------------------------------------------------
# Driver side
# --------------------------------------------------------------------------


def run_worker(peer, spec, timeout):
    return bl.run_worker(peer, spec, timeout, script=os.path.abspath(__file__))


def _progress(key, r, res):
    bl._progress(key, r, res)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "out", "crypto.json"))
    ap.add_argument("--bench-dir",
                    default=os.environ.get("TZ_BENCH_DIR", "/tmp/tz-bench"))
    ap.add_argument("--readers", default="1,2,4,8",
                    help="num_readers sweep for upstream (its best is used)")
    ap.add_argument("--ours-readers", default="",
                    help="optional num_readers sweep for ours (information)")
    ap.add_argument("--modes", default="cold,steady",
                    help="cold: fresh process; steady: memory pre-touched")
    ap.add_argument("--prewarm-mib", type=int, default=0,
                    help="memory each steady-mode load worker touches and releases"
                         " before timing (default: 2x the checkpoint + 256 MiB)")
    ap.add_argument("--threads", default="",
                    help="thread counts for the raw secretbox rows"
                         " (default: 1 and os.cpu_count())")
    ap.add_argument("--box-kib", type=int, default=2048,
                    help="secretbox box size (upstream's chunk size is 2 MiB)")
    ap.add_argument("--secretbox-passes", type=int, default=2,
                    help="timed passes per thread count inside each secretbox worker")
    ap.add_argument("--keep-files", action="store_true",
                    help="keep the .tensors files written here")
    bl.add_run_args(ap)
    args = ap.parse_args(argv)
    if args.worker is not None:
        return worker_main(args.worker)

    sweep = [int(x) for x in args.readers.split(",") if x.strip()]
    ours_sweep = [int(x) for x in args.ours_readers.split(",") if x.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("cold", "steady")]
    if bad or not modes:
        ap.error(f"--modes: unknown {bad}")
    ncpu = os.cpu_count() or 1
    threads = sorted({int(x) for x in args.threads.split(",") if x.strip()}
                     or {1, ncpu})

    ours, upstream = bl.default_peers()
    rawp = bl.Peer("raw", ours.python, None)  # stdlib + libsodium only

    lock, src, man = bl.open_checkpoint(args)  # noqa: F841 - lock held until exit
    data_bytes = man["data_bytes"]
    ref_fp = man["fingerprint"]
    prewarm_mib = args.prewarm_mib or int(2 * data_bytes / MiB) + 256
    d = args.bench_dir
    f_ours = os.path.join(d, "crypto-ours.enc.tensors")
    f_up = os.path.join(d, "crypto-upstream.enc.tensors")
    f_plain = os.path.join(d, "crypto-ours.plain.tensors")
    written = [f_ours, f_up, f_plain]

    # ---- configurations ------------------------------------------------
    saves = [
        ("save.ours.enc", "save  ours     encrypted", ours,
         dict(kind="save", src=src, dst=f_ours, encrypt=True)),
        ("save.upstream.enc", "save  upstream encrypted", upstream,
         dict(kind="save", src=src, dst=f_up, encrypt=True)),
        ("save.ours.plain", "save  ours     plain (context)", ours,
         dict(kind="save", src=src, dst=f_plain, encrypt=False)),
    ]
    # key -> which file's key the load needs (None: plain file)
    keyfile = {}
    loads = []
    for mode in modes:
        tag = f"[{mode}]"
        pw = prewarm_mib if mode == "steady" else 0

        def add(key, label, peer, path, enc_of, **kw):
            loads.append((f"{key}.{mode}", f"load  {label} {tag}", peer,
                          dict(kind="load", path=path, prewarm_mib=pw, **kw)))
            keyfile[f"{key}.{mode}"] = enc_of

        add("load.ours.enc", "ours     enc (default readers)", ours, f_ours, f_ours)
        for n in ours_sweep:
            add(f"load.ours.enc.r{n}", f"ours     enc num_readers={n}", ours,
                f_ours, f_ours, num_readers=n)
        add("load.ours.enc.verify", "ours     enc verify_hash", ours,
            f_ours, f_ours, verify_hash=True)
        add("load.ours.enc.upfile", "ours     enc, upstream's file", ours,
            f_up, f_up)
        for n in sweep:
            add(f"load.upstream.enc.r{n}", f"upstream enc num_readers={n}",
                upstream, f_up, f_up, num_readers=n)
        for n in sweep:
            add(f"load.upstream.enc.verify.r{n}", f"upstream enc verify r={n}",
                upstream, f_up, f_up, num_readers=n, verify_hash=True)
        add("load.ours.plain", "ours     plain (context)", ours, f_plain, None)
    sb_spec = dict(kind="secretbox", bytes=data_bytes, box=args.box_kib << 10,
                   threads=threads, passes=args.secretbox_passes)

    results = {k: [] for k, *_ in saves + loads}
    results["raw.secretbox"] = []
    keys = {}  # file -> hex key of the save that wrote it last

    # ---- phase 1: saves (interleaved repeats) ---------------------------
    print(f"[run] {len(saves)} save configs x {args.repeats} repeats", flush=True)
    bl.warm_page_cache(src)
    for r in range(args.repeats):
        for key, label, peer, spec in saves:
            res = run_worker(peer, spec, args.timeout)
            results[key].append(res)
            # The last save decides the file's state: a failed one leaves it
            # unusable, so its loads are reported as not run.
            keys[spec["dst"]] = res.get("key") if res.get("ok") else None
            if not res.get("ok") and os.path.exists(spec["dst"]):
                os.unlink(spec["dst"])
            _progress(key, r, res)

    # ---- phase 2: loads + raw secretbox (interleaved repeats) -------------
    print(f"[run] {len(loads)} load configs + raw secretbox x {args.repeats} "
          f"repeats (steady prewarm {prewarm_mib} MiB)", flush=True)
    for r in range(args.repeats):
        for key, label, peer, spec in loads:
            path = spec["path"]
            enc_of = keyfile[key]
            if not os.path.exists(path) or (enc_of and not keys.get(enc_of)):
                res = {"ok": False, "error": f"no file {os.path.basename(path)} "
                       "(its save failed)"}
            else:
                spec = dict(spec, key=keys.get(enc_of) if enc_of else None)
                bl.warm_page_cache(path)
                res = run_worker(peer, spec, args.timeout)
            results[key].append(res)
            _progress(key, r, res)
        res = run_worker(rawp, sb_spec, args.timeout)
        results["raw.secretbox"].append(res)
        _progress("raw.secretbox", r, res)

    # ---- summarise ---------------------------------------------------------
    best = {k: bl.best_of(v) for k, v in results.items()}
    best.pop("raw.secretbox", None)
    # Raw rows: best over repeats, per thread count and operation.
    raw_rows = []
    sb_ok = [x for x in results["raw.secretbox"] if x.get("ok")]
    sodium_version = sb_ok[0]["sodium_version"] if sb_ok else None
    for op in ("open", "seal"):
        for nt in threads:
            k = f"raw.secretbox_{op}.t{nt}"
            runs = []
            for x in sb_ok:
                v = x["by_threads"].get(str(nt))
                if v:
                    runs.append(dict(ok=True, seconds=v[f"{op}_seconds"],
                                     bytes=x["bytes"], failures=v[f"{op}_failures"],
                                     rss_base_kib=x["rss_base_kib"],
                                     rss_peak_kib=x["rss_peak_kib"]))
            if not runs:
                runs = [r for r in results["raw.secretbox"] if not r.get("ok")]
            lbl = (f"raw   secretbox_{op}_detached {nt} thread"
                   f"{'s' if nt > 1 else ''}" + (" (info)" if op == "seal" else ""))
            raw_rows.append((k, lbl))
            results[k] = runs
            best[k] = bl.best_of(runs)

    def best_group(keys_):
        c = [(k, best[k]) for k in keys_ if best.get(k)]
        return min(c, key=lambda kv: kv[1]["seconds"]) if c else (None, None)

    tput_ratio = bl.throughput_ratio

    def gbs(b):
        return None if b is None else b["bytes"] / b["seconds"] / 1e9

    ratios = []
    up_best_keys = set()

    def add_ratio(name, value, target, note):
        ratios.append(bl.target_row(name, value, target, note))

    add_ratio("enc save ours / upstream",
              tput_ratio(best["save.ours.enc"], best["save.upstream.enc"]), 3.0,
              "EncryptionParams.random(); write_state_dict + close()")
    for mode in modes:
        uk, ub = best_group([f"load.upstream.enc.r{n}.{mode}" for n in sweep])
        vk, vb = best_group([f"load.upstream.enc.verify.r{n}.{mode}" for n in sweep])
        up_best_keys.update(k for k in (uk, vk) if k)
        best[f"load.upstream.enc.best.{mode}"] = ub
        best[f"load.upstream.enc.verify.best.{mode}"] = vb
        add_ratio(f"enc load ours / upstream [{mode}]",
                  tput_ratio(best[f"load.ours.enc.{mode}"], ub), 3.0,
                  f"ours default readers vs upstream best ({uk})")
        add_ratio(f"enc verify ours / upstream [{mode}]",
                  tput_ratio(best[f"load.ours.enc.verify.{mode}"], vb), 3.0,
                  f"verify_hash=True; upstream best ({vk})")
    # Decryption inside a load vs libsodium's own secretbox_open on the same cores.
    lmode = "steady" if "steady" in modes else modes[0]
    enc_load = best.get(f"load.ours.enc.{lmode}")
    plain_load = best.get(f"load.ours.plain.{lmode}")
    raw_open = best.get(f"raw.secretbox_open.t{max(threads)}")
    raw_open1 = best.get("raw.secretbox_open.t1")
    dec_ratio = tput_ratio(enc_load, raw_open)
    add_ratio(f"enc load / raw secretbox_open [{lmode}]", dec_ratio, 0.80,
              f"ours encrypted load, no verify, vs {max(threads)}-thread "
              "crypto_secretbox_open_detached over the same bytes")
    ratios.append(bl.rss_target("enc load ours peak RSS delta", best.get("load.ours.enc.cold"),
                                data_bytes, "cold"))

    # ---- print -------------------------------------------------------------
    info_ours = bl.first_info(results, ["save.ours.enc", "save.ours.plain"]
                              + [k for k, *_ in loads if ".ours." in k])
    info_up = bl.first_info(results, ["save.upstream.enc"]
                            + [k for k, *_ in loads if ".upstream." in k])
    print()
    print(f"checkpoint: {man['tensors']} fp16 tensors, "
          f"{data_bytes / GiB:.3f} GiB data (d={man['hidden']}, "
          f"layers={man['layers']}, vocab={man['vocab']}), dir {d}")
    print(f"ours:     {ours.python}  tensorizer {info_ours.get('version')} "
          f"from {info_ours.get('module')}")
    print(f"upstream: {upstream.python}  tensorizer {info_up.get('version')} "
          f"from {info_up.get('module')}")
    print(f"libsodium {sodium_version} via ctypes ({SODIUM_SONAME}); "
          f"boxes of {args.box_kib} KiB")
    print(f"host: {ncpu} CPUs; best of {args.repeats}; GB/s = 1e9 bytes of tensor "
          f"data per second; page cache warm; [steady] = {prewarm_mib} MiB "
          "pre-touched before timing")
    print("dRSS/peak: peak RSS is reset (clear_refs) just before timing, so "
          "both belong to the timed operation")
    cols = 46
    print()
    print(f"{'row':<{cols}}  {'seconds':>8}  {'GB/s':>7}  {'dRSS MiB':>9}  "
          f"{'peak MiB':>9}  data")
    print("-" * (cols + 50))
    labels = {k: lbl for k, lbl, *_ in saves + loads}
    labels.update(dict(raw_rows))
    order = [k for k, *_ in saves] + [k for k, *_ in loads] + [k for k, _ in raw_rows]
    for key in order:
        line = bl.fmt_row(labels[key], best[key], results[key], data_bytes,
                          ref_fp if key.startswith("load.") else None, cols)
        if key in up_best_keys:
            line += "  <- best upstream"
        b = best[key]
        if key.startswith("raw.") and b is not None:
            line = line.rstrip() + ("  ok" if not b.get("failures") else
                                    f"  {b['failures']} boxes FAILED")
        print(line)

    print()
    print(f"decryption inside a load vs raw libsodium ([{lmode}], same cores, "
          "same run):")
    g_enc, g_plain = gbs(enc_load), gbs(plain_load)
    g_raw, g_raw1 = gbs(raw_open), gbs(raw_open1)

    def f(v, unit=" GB/s"):
        return "n/a" if v is None else f"{v:.2f}{unit}"

    print(f"  ours encrypted load (no verify)          {f(g_enc)}")
    print(f"  raw crypto_secretbox_open_detached       {f(g_raw)} "
          f"({max(threads)} threads), {f(g_raw1)} (1 thread)")
    pct = "n/a" if dec_ratio is None else f"{100 * dec_ratio:.0f}%"
    print(f"  decryption inside load / raw secretbox   {pct} "
          f"(target >= 80%)")
    share = None if g_enc is None or g_plain is None else g_enc / g_plain
    print(f"  ours plain load (context)                {f(g_plain)}; encrypted "
          f"load runs at {'n/a' if share is None else f'{100 * share:.0f}%'} "
          "of plain")
    # What decryption alone costs inside the load: the encrypted load minus the
    # plain load of the same model (same reads, copies and page faults).
    stage = None
    if g_enc and g_plain and g_enc < g_plain:
        stage = data_bytes / (data_bytes / (g_enc * 1e9) - data_bytes / (g_plain * 1e9)) / 1e9
    stage_pct = "n/a" if stage is None or not g_raw else f"{100 * stage / g_raw:.0f}%"
    print(f"  decryption stage inside the load         {f(stage)} (derived: bytes / "
          f"(t_encrypted - t_plain)) = {stage_pct} of raw secretbox")
    up_enc = best.get(f"load.upstream.enc.best.{lmode}")
    ceil = tput_ratio(raw_open, up_enc)
    print(f"  ceiling for enc load ours / upstream     "
          f"{'n/a' if ceil is None else f'{ceil:.2f}x'} (raw secretbox_open / "
          f"upstream's best encrypted load: a load cannot decrypt faster than "
          f"libsodium)")
    raw_seal = best.get(f"raw.secretbox_seal.t{max(threads)}")
    ceil_save = tput_ratio(raw_seal, best.get("save.upstream.enc"))
    print(f"  ceiling for enc save ours / upstream     "
          f"{'n/a' if ceil_save is None else f'{ceil_save:.2f}x'} (raw "
          f"secretbox_seal / upstream's encrypted save; ignores the write itself)")
    print()
    bl.print_targets(ratios, best, results, ref_fp, width=40)
    nohwm = [k for k, v in best.items() if v and v.get("hwm_reset") is False]
    if nohwm:
        print(f"  note: peak RSS could not be reset in {nohwm}; their peak "
              "includes imports/prewarm")

    bl.write_report(args.out, args, man, (ours, upstream), (info_ours, info_up), best, ref_fp,
                    ratios, results, prewarm_mib=prewarm_mib, sodium_version=sodium_version,
                    decryption_vs_raw=dict(mode=lmode, enc_load_gbs=g_enc, plain_load_gbs=g_plain,
                                           raw_open_gbs=g_raw, raw_open_1t_gbs=g_raw1,
                                           raw_threads=max(threads), ratio=dec_ratio,
                                           ceiling_vs_upstream=ceil,
                                           save_ceiling_vs_upstream=ceil_save,
                                           enc_over_plain=share))
    if not args.keep_files:
        for p in written:
            if os.path.exists(p):
                os.unlink(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
