#!/usr/bin/env python3
"""Runs upstream tensorizer 2.12.1's own test suite against two implementations
(upstream itself, from .venv-upstream, and this checkout's package, from .venv)
in the same environment, and prints one table: test | upstream | ours.

Exit status: 0 when every test that passes with upstream also passes with ours
(tests in EXCEPTIONS aside) and upstream ran; 1 when a test regressed; 2 when
upstream itself could not run (or ran nothing), so the target cannot silently
pass. Prepared by scripts/setup-upstream-suite.sh.
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "build" / "upstream-suite"
FILES = (
    "test_serialization.py",
    "test_stream_io.py",
    "test_torch_compat.py",
    "test_syscalls.py",
)

_INTERNET = "needs the public internet"
_CW_S3 = _INTERNET + " (reads CoreWeave's public S3 endpoint)"
_GITHUB = _INTERNET + " (reads a GitHub URL)"

# Tests deselected for both implementations: not run, reported "excluded".
EXCLUDED = {
    **{
        f"test_stream_io.py::TestCurlStream::{name}": _GITHUB
        for name in (
            "test_curl_stream",
            "test_curl_stream_begin",
            "test_curl_stream_end",
            "test_curl_stream_begin_and_end",
            "test_curl_stream_invalid_range",
            "test_curl_stream_buffer_end",
            "test_curl_stream_seek",
            "test_curl_stream_seek_forward",
        )
    },
    **{
        f"test_serialization.py::TestDeserialization::{name}": _CW_S3
        for name in (
            "test_s3",
            "test_s3_multiple_readers",
            "test_s3_fp16",
            "test_s3_lazy_load",
            "test_redis",  # fills redis from the public S3 object first
        )
    },
}

# Tests run for both implementations whose result does not count against ours.
EXEMPT = {
    "test_stream_io.py::TestS3::test_upload": (
        "uploads to the public S3 endpoint, which moto's mock_s3 intercepts "
        "only inside boto3; a native S3 client sends real HTTP (fails fast: "
        "no DNS here)"
    ),
}

FILE_TIMEOUT_S = 900


def _ident(python, env, expect):
    """tensorizer's location and version as `python` imports it."""
    code = (
        "import tensorizer, os; "
        "print(os.path.realpath(tensorizer.__file__)); print(tensorizer.__version__)"
    )
    r = subprocess.run(
        [python, "-c", code], env=env, capture_output=True, text=True, cwd="/"
    )
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1:] or ["import failed"]
    path, version = r.stdout.split()
    return path, version


def _parse_junit(path, file):
    results = {}
    if not path.exists():
        return results
    try:
        tree = ET.parse(path)
    except ET.ParseError:
        return results
    for tc in tree.iter("testcase"):
        cls = tc.get("classname", "")
        name = tc.get("name", "")
        cls_short = cls.rsplit(".", 1)[-1] if "." in cls else ""
        if not cls_short:
            # A collection error: the whole file.
            results[f"{file}::<collection>"] = "error"
            continue
        tid = f"{file}::{cls_short}::{name}"
        outcome = "passed"
        for child in tc:
            if child.tag in ("failure",):
                outcome = "failed"
            elif child.tag == "error":
                # An error in teardown after a failure keeps "failed".
                outcome = "failed" if outcome == "failed" else "error"
            elif child.tag == "skipped":
                outcome = "xfail" if child.get("type") == "pytest.xfail" else "skipped"
        results[tid] = outcome
    return results


def run_impl(label, python, env, outdir, log):
    results = {}
    file_status = {}
    for file in FILES:
        junit = outdir / f"{label}-{file}.xml"
        cmd = [
            python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
            "--junitxml", str(junit), "-o", "junit_family=xunit1",
            file,
        ]
        for tid in EXCLUDED:
            if tid.startswith(file + "::"):
                cmd += ["--deselect", tid]
        t0 = time.monotonic()
        log.write(f"\n===== {label}: {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(
            cmd, cwd=SUITE / "tests", env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=FILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = "timeout"
        # Servers a test started and did not stop (a setUp that failed after
        # starting redis-server skips its tearDown) would hold the suite's
        # fixed ports for the next run: end the whole session each time.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        dt = time.monotonic() - t0
        got = _parse_junit(junit, file)
        file_status[file] = (rc, dt, len(got))
        print(f"  {label:8} {file:24} rc={rc} {dt:6.1f}s {len(got)} results",
              flush=True)
        results.update(got)
    return results, file_status


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ours-python", default=str(ROOT / ".venv" / "bin" / "python"))
    ap.add_argument("--ours-pythonpath", default="",
                    help="prepended to PYTHONPATH for ours (e.g. a checkout's tz-python)")
    ap.add_argument("--upstream-python",
                    default=str(ROOT / ".venv-upstream" / "bin" / "python"))
    ap.add_argument("--only", choices=("ours", "upstream"),
                    help="run one implementation (no verdict)")
    args = ap.parse_args()

    tests_dir = SUITE / "tests"
    if not all((tests_dir / f).exists() for f in FILES):
        print("upstream suite: not set up (scripts/setup-upstream-suite.sh)",
              file=sys.stderr)
        return 2

    base = dict(os.environ)
    for k in ("PYTHONPATH", "HF_TOKEN", "AWS_PROFILE"):
        base.pop(k, None)
    base.update(
        HF_HOME=str(SUITE / "hf"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        PYTHONDONTWRITEBYTECODE="1",
        TOKENIZERS_PARALLELISM="false",
        # No proxy may route the suite anywhere; loopback only.
        NO_PROXY="*", no_proxy="*",
    )
    overlay = str(SUITE / "overlay")
    impls = {}
    env_up = dict(base, PYTHONPATH=overlay)
    ours_pp = [p for p in (args.ours_pythonpath, overlay) if p]
    env_ours = dict(base, PYTHONPATH=os.pathsep.join(ours_pp))
    # The overlay must come after ours (it holds only moto), so ours wins the
    # `tensorizer` name; upstream's venv has no checkout on its path.
    impls["upstream"] = (args.upstream_python, env_up)
    impls["ours"] = (args.ours_python, env_ours)

    problems = []
    up_path, up_ver = _ident(args.upstream_python, env_up, "upstream")
    ours_path, ours_ver = _ident(args.ours_python, env_ours, "ours")
    print(f"upstream: {args.upstream_python}: tensorizer {up_ver} at {up_path}")
    print(f"ours:     {args.ours_python}: tensorizer {ours_ver} at {ours_path}")
    if up_path is None or up_ver != "2.12.1":
        problems.append("upstream tensorizer 2.12.1 cannot be imported")
    elif up_path.startswith(str(ROOT / "tz-python")):
        problems.append("the upstream interpreter imports this checkout's package")
    if ours_path is None:
        problems.append("our tensorizer cannot be imported")
    elif up_path and os.path.dirname(ours_path) == os.path.dirname(up_path):
        problems.append("ours and upstream are the same package")
    elif "site-packages" in ours_path and not args.ours_pythonpath:
        # make python puts tz-python on .venv's path; an installed wheel
        # is also acceptable, but say which one ran.
        print("note: ours is an installed package, not the checkout")
    if args.only == "upstream" and up_path is not None:
        problems = [p for p in problems if "ours" not in p and "our " not in p]
    if args.only == "ours" and ours_path is not None:
        problems = [p for p in problems if "upstream" not in p]
    if problems:
        for p in problems:
            print("upstream suite: " + p, file=sys.stderr)
        return 2

    outdir = SUITE / "results"
    outdir.mkdir(parents=True, exist_ok=True)
    for f in outdir.glob("*.xml"):
        f.unlink()
    t_all = time.monotonic()
    results, status = {}, {}
    with open(outdir / "log.txt", "w") as log:
        for label in ("upstream", "ours"):
            if args.only and args.only != label:
                continue
            python, env = impls[label]
            print(f"running the suite with {label} ...", flush=True)
            results[label], status[label] = run_impl(label, python, env, outdir, log)
    wall = time.monotonic() - t_all

    up = results.get("upstream", {})
    ours = results.get("ours", {})
    ids = sorted(set(up) | set(ours) | set(EXCLUDED))
    # A test upstream ran but ours never reported (its file failed to collect
    # or crashed) is "missing" for ours.
    rows, regressions, exempted, fixed = [], [], [], []
    for tid in ids:
        if tid in EXCLUDED:
            u = o = "excluded"
        else:
            file = tid.split("::", 1)[0]

            def outcome(label, res):
                if label not in results:
                    return "-"
                if tid in res:
                    return res[tid]
                # Not reported: its file failed to import, or crashed.
                return "coll.err" if res.get(f"{file}::<collection>") else "missing"

            u, o = outcome("upstream", up), outcome("ours", ours)
            if tid.endswith("::<collection>"):
                u = "ok" if u in ("coll.err", "missing") else u
                o = "ok" if o in ("coll.err", "missing") else o
        note = ""
        if tid in EXCLUDED:
            note = EXCLUDED[tid]
        elif u == "passed" and o not in ("passed", "-"):
            if tid in EXEMPT:
                note = "exempt: " + EXEMPT[tid]
                exempted.append(tid)
            else:
                note = "REGRESSION"
                regressions.append((tid, o))
        elif tid in EXEMPT:
            note = "exempt: " + EXEMPT[tid]
        elif o == "passed" and u not in ("passed", "-"):
            fixed.append(tid)
        rows.append((tid, u, o, note))

    w = max(len(r[0]) for r in rows)
    print()
    print(f"{'test':{w}} | {'upstream':9} | {'ours':9} | note")
    print(f"{'-' * w}-+-{'-' * 9}-+-{'-' * 9}-+-----")
    for tid, u, o, note in rows:
        print(f"{tid:{w}} | {u:9} | {o:9} | {note}")

    def count(res, what):
        return sum(1 for v in res.values() if v == what)

    print()
    for label in ("upstream", "ours"):
        if label not in results:
            continue
        res = {k: v for k, v in results[label].items() if not k.endswith("::<collection>")}
        print(f"{label:8}: {count(res, 'passed')} passed, {count(res, 'failed')} failed, "
              f"{count(res, 'error')} errors, {count(res, 'skipped')} skipped"
              + "".join(f"; {f}: collection error" for f in FILES
                        if results[label].get(f"{f}::<collection>") == "error"))
    print(f"excluded (both): {len(EXCLUDED)}; exempt: {len(EXEMPT)}")
    print(f"wall time: {wall:.0f}s (log: {outdir / 'log.txt'})")

    if "upstream" in results:
        broken = [
            f"{f} (rc={st[0]}, {st[2]} results)"
            for f, st in status["upstream"].items()
            if st[2] == 0 or st[0] == "timeout" or st[0] not in (0, 1, "timeout")
            or up.get(f"{f}::<collection>") == "error"
        ]
        if broken or count(up, "passed") == 0:
            print("FAIL: upstream itself did not run: " + ", ".join(broken or ["nothing passed"]))
            return 2
    if args.only:
        return 0
    if regressions:
        print(f"FAIL: {len(regressions)} test(s) pass with upstream 2.12.1 but not with ours:")
        for tid, o in regressions:
            print(f"  {tid}: {o}")
        return 1
    print("OK: every test that passes with upstream 2.12.1 passes with ours"
          + (f" ({len(exempted)} exempt)" if exempted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
