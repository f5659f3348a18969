"""Loading over HTTP(S) from nginx on loopback: several readers, TLS with a
throwaway CA, redirects, 4xx errors, and faults injected by a proxy
(connections cut mid-body, stalls, 500/503 once, a server that stays down)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import torch

import servers
from tensorizer import (
    CryptographyError,
    DecryptionParams,
    EncryptionParams,
    TensorDeserializer,
    TensorSerializer,
)
from tensorizer import _native, stream_io
from tensorizer._native import ffi
from tensorizer.serialization import HashMismatchError

pytestmark = [
    pytest.mark.ours_only,  # upstream shells out to curl with other knobs
    pytest.mark.skipif(not Path(servers.NGINX).exists(), reason="nginx is not installed"),
]

KEY = bytes(range(32))


def _state_dict():
    g = torch.Generator().manual_seed(7)
    return {
        "big": torch.randn(3 * 1024 * 1024 + 5, generator=g),  # ~12 MiB: split across readers
        "mid": torch.randn(300, 700, generator=g).to(torch.bfloat16),
        "small": torch.arange(10, dtype=torch.int64),
        "empty": torch.zeros(0),
    }


def _many_small():
    """150 small tensors around one of 64 MiB: a model's worth of round trips."""
    sd = {f"t{i}": torch.full((1000 + i,), float(i)) for i in range(150)}
    items = list(sd.items())
    items.insert(75, ("skipme", torch.randn(16 << 20, generator=torch.Generator().manual_seed(3))))
    return dict(items)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    sd = _state_dict()
    with TensorSerializer(root / "plain.tensors") as s:
        s.write_state_dict(sd)
    with TensorSerializer(root / "enc.tensors", encryption=EncryptionParams(KEY)) as s:
        s.write_state_dict(sd)
    many = _many_small()
    with TensorSerializer(root / "many.tensors") as s:
        s.write_state_dict(many)
    # The same file with one byte of tensor "t100"'s data flipped.
    data = bytearray((root / "many.tensors").read_bytes())
    with TensorDeserializer(root / "many.tensors", lazy_load=True) as t:
        entry = next(e for e in t._entries if e.name == "t100")
        data[entry.data_offset + 5] ^= 0x40
    (root / "bad.tensors").write_bytes(bytes(data))
    tls = servers.make_ca(tmp_path_factory.mktemp("ca"))
    with servers.Nginx(root, tmp_path_factory.mktemp("nginx"), tls=tls) as nginx:
        yield {"nginx": nginx, "sd": sd, "many": many, "root": root, "tls": tls}


def _check(t, sd):
    assert list(t.keys()) == list(sd.keys())
    for k, v in sd.items():
        assert torch.equal(t[k], v), k


@pytest.mark.parametrize("num_readers", [1, 2, 4, 8])
def test_load_over_http(site, num_readers):
    url = site["nginx"].url("plain.tensors")
    with TensorDeserializer(url, num_readers=num_readers, verify_hash=True) as t:
        _check(t, site["sd"])


@pytest.mark.parametrize("verify", [False, True])
def test_encrypted_over_http(site, verify):
    url = site["nginx"].url("enc.tensors")
    with TensorDeserializer(url, encryption=DecryptionParams.from_key(KEY), verify_hash=verify) as t:
        _check(t, site["sd"])


@pytest.mark.parametrize("num_readers", [1, 4])
def test_neighbouring_tensors_share_requests(site, num_readers):
    with servers.FaultProxy(site["nginx"].port) as proxy:
        with TensorDeserializer(proxy.url("many.tensors"), num_readers=num_readers, verify_hash=True) as t:
            _check(t, site["many"])
        # One request per reader for 151 tensors and their headers: the size
        # probe's response (which brings the file header and metadata index)
        # stays open and carries on with the first reader's share.
        assert proxy.requests <= num_readers, proxy.requests


def test_an_object_smaller_than_the_probe_cut_mid_probe(site, tmp_path):
    sd = {"a": torch.arange(5000, dtype=torch.int32), "b": torch.ones(3, 7)}
    with TensorSerializer(site["root"] / "tiny.tensors") as s:
        s.write_state_dict(sd)
    with servers.FaultProxy(site["nginx"].port, [("cut", 9000)]) as proxy:
        with TensorDeserializer(proxy.url("tiny.tensors"), verify_hash=True) as t:
            _check(t, sd)
        assert proxy.requests == 2  # the probe, resumed once; everything else came with it


@pytest.mark.parametrize("num_readers", [1, 2])
def test_the_probe_response_carries_the_load(site, num_readers):
    # The size probe's response stays open after the first MiB and carries
    # the first reader's share: one request per reader in all.
    size = (site["root"] / "plain.tensors").stat().st_size
    with servers.FaultProxy(site["nginx"].port) as proxy:
        with TensorDeserializer(proxy.url("plain.tensors"), num_readers=num_readers, verify_hash=True) as t:
            _check(t, site["sd"])
        assert proxy.requests == num_readers
        if num_readers == 1:
            # Nothing arrives twice. (With more readers the open response may
            # read ahead into the next reader's share before it is closed.)
            assert proxy.response_bytes < size + 64 * 1024


@pytest.mark.parametrize("num_readers", [1, 2])
def test_a_lazy_load_in_file_order_goes_on_one_response(site, num_readers):
    # A lazy load reads one tensor per access. In file order every access
    # continues the open response, as upstream's one stream does, instead of
    # sending a request per tensor. With 2 readers the 64 MiB tensor is read
    # as two ranges at once: the open response carries the first, and a new
    # one, which the tensors after it continue, the second. (If the second
    # range starts before the first has taken the open response, it leaves
    # that response alone and asks for an exact range; the next tensor then
    # opens a response: one request more.)
    size = (site["root"] / "many.tensors").stat().st_size
    with servers.FaultProxy(site["nginx"].port) as proxy:
        with TensorDeserializer(proxy.url("many.tensors"), lazy_load=True, verify_hash=True,
                                num_readers=num_readers) as t:
            for name, expected in site["many"].items():
                assert torch.equal(t[name], expected), name
        assert num_readers <= proxy.requests <= 2 * num_readers - 1
        # Nothing arrives twice, except what the first response read ahead
        # (up to its socket buffers) into the second's range before it closed.
        assert proxy.response_bytes < size + (64 * 1024 if num_readers == 1 else 16 << 20)


def test_a_lazy_load_that_skips_forward_opens_a_response_after_the_gap(site):
    size = (site["root"] / "many.tensors").stat().st_size
    skipped = site["many"]["skipme"].numel() * 4
    with servers.FaultProxy(site["nginx"].port) as proxy:
        with TensorDeserializer(proxy.url("many.tensors"), lazy_load=True, num_readers=1) as t:
            for name, expected in site["many"].items():
                if name != "skipme":
                    assert torch.equal(t[name], expected), name
        # The probe's response up to the 64 MiB tensor, then one from after it.
        assert proxy.requests == 2
        # The first response may have read ahead into the skipped tensor as
        # far as its socket buffers before it was closed; the rest was not sent.
        assert proxy.response_bytes < size - skipped + (16 << 20)


def test_a_lazy_load_going_backwards_asks_for_exact_ranges(site):
    # Reads going back get closed ranges. An open-ended one would read ahead
    # into the tensors after it (already loaded) as far as the socket buffers.
    sd = {f"t{i}": torch.full((1 << 20,), float(i)) for i in range(8)}  # 4 MiB each
    with TensorSerializer(site["root"] / "backwards.tensors") as s:
        s.write_state_dict(sd)
    size = (site["root"] / "backwards.tensors").stat().st_size
    with servers.FaultProxy(site["nginx"].port) as proxy:
        with TensorDeserializer(proxy.url("backwards.tensors"), lazy_load=True) as t:
            for name in reversed(list(sd)):
                assert torch.equal(t[name], sd[name]), name
        # The size probe's response read ahead a few MiB before it was closed;
        # after that every byte was asked for once.
        assert proxy.response_bytes < size + (8 << 20), proxy.response_bytes


def test_a_lazy_load_survives_its_open_response_being_cut(site):
    # The open response dies 3 MiB in, inside the 64 MiB tensor: that read
    # resumes on a request of its own, and the next access opens a new response.
    with servers.FaultProxy(site["nginx"].port, [("cut", 3 << 20)]) as proxy:
        with TensorDeserializer(proxy.url("many.tensors"), lazy_load=True, verify_hash=True, num_readers=1) as t:
            for name, expected in site["many"].items():
                assert torch.equal(t[name], expected), name
        assert proxy.requests == 3


def test_closing_while_the_open_probe_response_stalls_does_not_wait_for_it(site):
    # The server stops sending just after the probe's first MiB and holds the
    # connection for a minute: closing ends that transfer at once (within
    # about a second), not after the 20 s stall timeout or the server's minute.
    with servers.FaultProxy(site["nginx"].port, [("stall_after", (1 << 20) + 8192, 60)]) as proxy:
        t = TensorDeserializer(proxy.url("plain.tensors"), lazy_load=True)
        assert torch.equal(t["small"], site["sd"]["small"])
        start = time.monotonic()
        t.close()
        assert time.monotonic() - start < 10


def test_a_filtered_load_does_not_download_what_it_skips(site):
    size = (site["root"] / "many.tensors").stat().st_size
    with servers.FaultProxy(site["nginx"].port) as proxy:
        with TensorDeserializer(proxy.url("many.tensors"), filter_func=lambda name: name != "skipme") as t:
            assert "skipme" not in t
            assert torch.equal(t["t149"], site["many"]["t149"])
        # The probe's open stream may have read ahead as far as its socket
        # buffers (a few MiB here) before it was closed; the 64 MiB were not.
        skipped = site["many"]["skipme"].numel() * 4
        assert proxy.response_bytes < size - skipped + (16 << 20)


@pytest.mark.parametrize("num_readers", [1, 4])
def test_corruption_inside_a_shared_request_names_the_tensor(site, num_readers):
    url = site["nginx"].url("bad.tensors")
    with pytest.raises(HashMismatchError, match="t100"):
        TensorDeserializer(url, num_readers=num_readers, verify_hash=True)
    # Without verification the other tensors still arrive intact.
    with TensorDeserializer(url, num_readers=num_readers) as t:
        assert torch.equal(t["t99"], site["many"]["t99"])


def test_a_wrong_key_over_http_fails_and_returns_nothing(site):
    url = site["nginx"].url("enc.tensors")
    with pytest.raises(CryptographyError):
        TensorDeserializer(url, encryption=DecryptionParams.from_key(bytes(32)))
    big = ffi.new("uint8_t[]", 4 * (3 * 1024 * 1024 + 5))
    with pytest.raises(CryptographyError):
        _native_read_into(url, 0, big, key=bytes(32))
    assert bytes(ffi.buffer(big, 4096)) == bytes(4096)  # never the unauthenticated bytes


def test_lazy_load_and_redirect(site):
    url = site["nginx"].url("redirect/plain.tensors")
    with TensorDeserializer(url, lazy_load=True) as t:
        assert torch.equal(t["small"], site["sd"]["small"])


def test_https_with_the_test_ca(site, monkeypatch):
    url = site["nginx"].url("plain.tensors", tls=True)
    monkeypatch.setenv("CURL_CA_BUNDLE", str(site["tls"]["ca"]))
    with TensorDeserializer(url, num_readers=2) as t:
        _check(t, site["sd"])


def test_https_verification_failure(site, monkeypatch):
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    url = site["nginx"].url("plain.tensors", tls=True)
    with pytest.raises(OSError, match="(?i)certificate"):
        TensorDeserializer(url)
    # The wording upstream's suite matches, after the clear native message;
    # and a certificate failure is final: one attempt, no backoff.
    with pytest.raises(OSError) as ei:
        stream_io.open_stream(url, "rb")
    assert "cURL exit code 60" in str(ei.value)
    assert "Giving up" not in str(ei.value)


def test_not_found_names_the_url_without_its_query(site):
    url = site["nginx"].url("missing.tensors") + "?X-Amz-Signature=topsecret"
    with pytest.raises(FileNotFoundError) as ei:
        TensorDeserializer(url)
    assert "missing.tensors" in str(ei.value) and "404" in str(ei.value)
    assert "topsecret" not in str(ei.value)


# Plans are per connection, and connections are kept alive: a "cut" first
# lets the size probe and some data through on one connection, so the
# faults after it land in the middle of tensor data.
@pytest.mark.parametrize(
    "plan",
    [
        [("cut", 3 << 20)],  # reset mid-body: resumed, not restarted
        [("cut", 1 << 20), ("cut", 2 << 20)],
        [("cut", 1 << 20), ("status", 500)],
        [("cut", 1 << 20), ("status", 503), ("status", 429)],
    ],
    ids=["cut", "cut-twice", "500-once", "503-then-429"],
)
def test_faults_are_survived_with_identical_bytes(site, plan):
    with servers.FaultProxy(site["nginx"].port, plan) as proxy:
        with TensorDeserializer(proxy.url("plain.tensors"), num_readers=1, verify_hash=True) as t:
            _check(t, site["sd"])
        assert proxy.connections == len(plan) + 1
        # Resumed from the byte where each cut happened: nothing is fetched twice
        # (beyond response headers).
        size = (site["root"] / "plain.tensors").stat().st_size
        assert proxy.response_bytes < size + 64 * 1024


def _native_load(url, **options):
    """Loads every tensor through the C ABI with reader options; returns bytes per tensor."""
    from tensorizer.stream_io import _native_options

    lib = _native.lib
    opts = _native_options(options)
    r_p = ffi.new("tz_reader **")
    _native.check(lib.tz_reader_open(r_p, url.encode(), opts))
    reader = ffi.gc(r_p[0], lib.tz_reader_free)
    n = ffi.new("uint64_t *")
    _native.check(lib.tz_reader_tensor_count(n, reader))
    out = []
    for i in range(n[0]):
        info = ffi.new("tz_tensor_info *", {"version": lib.TZ_TENSOR_INFO_VERSION})
        _native.check(lib.tz_reader_tensor_info(info, reader, i))
        buf = ffi.new("uint8_t[]", max(int(info.nbytes), 1))
        _native.check(lib.tz_reader_read(reader, i, buf, info.nbytes, lib.TZ_READ_VERIFY_HASH))
        out.append(bytes(ffi.buffer(buf, int(info.nbytes))))
    return out


def _native_read_into(url, index, buf, key):
    """Reads tensor `index` into `buf` through the C ABI, decrypting with `key`."""
    from tensorizer.serialization import _Options

    lib = _native.lib
    opts = _Options({}, key=DecryptionParams.from_key(key)._native_key())
    try:
        r_p = ffi.new("tz_reader **")
        _native.check(lib.tz_reader_open(r_p, url.encode(), opts.ptr))
    finally:
        opts.free()
    reader = ffi.gc(r_p[0], lib.tz_reader_free)
    _native.check(lib.tz_reader_read(reader, index, buf, len(buf), lib.TZ_READ_NO_VERIFY_HASH))


def test_a_stall_is_detected_and_resumed(site):
    expected = _native_load(site["nginx"].url("plain.tensors"))
    with servers.FaultProxy(site["nginx"].port, [("cut", 1 << 20), ("stall", 30)]) as proxy:
        start = time.monotonic()
        got = _native_load(proxy.url("plain.tensors"), http_stall_timeout_ms=1000)
        assert time.monotonic() - start < 20
    assert got == expected


def test_a_server_that_stays_down_fails_in_bounded_time(site):
    with servers.FaultProxy(site["nginx"].port, [("status", 503)] * 50) as proxy:
        start = time.monotonic()
        with pytest.raises(OSError, match="Giving up after 4"):
            _native_load(proxy.url("plain.tensors"), http_max_attempts=4, http_backoff_ms=20)
        assert time.monotonic() - start < 10
    port = servers.free_port()  # nothing listens there
    with pytest.raises(OSError, match="(?i)connect"):
        _native_load(f"http://127.0.0.1:{port}/x.tensors", http_max_attempts=2, http_backoff_ms=10)


def test_upstream_reads_what_we_serve_and_we_read_upstreams(site, upstream, tmp_path):
    if shutil.which("curl") is None:
        pytest.skip("upstream's HTTP reader needs the curl tool")
    url = site["nginx"].url("plain.tensors")
    sums = upstream.run_upstream_json(
        f"""
import json
from tensorizer import TensorDeserializer
t = TensorDeserializer({url!r}, verify_hash=True)
print(json.dumps({{k: float(v.double().sum()) for k, v in t.items()}}))
"""
    )
    assert sums == pytest.approx({k: float(v.double().sum()) for k, v in site["sd"].items()})
    # Upstream writes a file into the served folder; we read it over HTTP.
    target = site["root"] / "upstream.tensors"
    upstream.run_upstream(
        f"""
import torch
from tensorizer import TensorSerializer
s = TensorSerializer({str(target)!r})
s.write_state_dict({{"w": torch.arange(100000, dtype=torch.float32)}})
s.close()
"""
    )
    with TensorDeserializer(site["nginx"].url("upstream.tensors"), verify_hash=True) as t:
        assert torch.equal(t["w"], torch.arange(100000, dtype=torch.float32))


def test_open_stream_reads_ranges_and_feeds_the_deserializer(site):
    from tensorizer import stream_io

    url = site["nginx"].url("plain.tensors")
    data = (site["root"] / "plain.tensors").read_bytes()
    with stream_io.open_stream(url, "rb") as f:
        assert f.read(5) == b"|TZR|"
        f.seek(1000)
        assert f.read(100) == data[1000:1100]
        f.seek(-10, 2)
        assert f.read() == data[-10:]
    with stream_io.open_stream(url, "rb", begin=100, end=200) as f:
        assert f.tell() == 100
        assert f.read() == data[100:200]
    with stream_io.open_stream(url, "rb") as f:
        with TensorDeserializer(f, verify_hash=True) as t:
            _check(t, site["sd"])
    with pytest.raises(ValueError, match="read-only"):
        stream_io.open_stream(url, "wb")


def test_curl_stream_file_reads_ranges_and_sends_headers(site):
    data = (site["root"] / "plain.tensors").read_bytes()
    with servers.FaultProxy(site["nginx"].port) as proxy:
        with stream_io.CURLStreamFile(proxy.url("plain.tensors"), begin=100, end=5000,
                                      headers={"X-Tensorizer-Test": "yes"}) as f:
            assert f.tell() == 100
            assert f.read(10) == data[100:110]
            f.seek(4000)
            assert f.read() == data[4000:5000]  # stops at `end`
            assert f.read(1) == b""
            # The buffer (no larger than the range) took the whole range at once.
            assert f.bytes_read == 4900 and f.read_operations == 1
        assert b"X-Tensorizer-Test: yes" in proxy.request_data
    # At offset 0, a TensorDeserializer reads the URL natively.
    with TensorDeserializer(stream_io.CURLStreamFile(site["nginx"].url("plain.tensors"))) as t:
        _check(t, site["sd"])
    # open_stream gives the same class, as upstream's does.
    with stream_io.open_stream(site["nginx"].url("plain.tensors")) as f:
        assert isinstance(f, stream_io.CURLStreamFile)
        assert f.read(5) == b"|TZR|"


def test_curl_stream_file_has_upstreams_attributes(site):
    blob = os.urandom(4 << 20)
    (site["root"] / "blob.bin").write_bytes(blob)
    # The opening response goes through; the next connection gets a 403.
    with servers.FaultProxy(site["nginx"].port, plan=[("cut", 1 << 40), ("status", 403)]) as proxy:
        with stream_io.CURLStreamFile(proxy.url("blob.bin"), buffer_size=4096) as f:
            headers = f.response_headers
            assert headers["Content-Range"] == f"bytes 0-{len(blob) - 1}/{len(blob)}"
            assert headers["ETag"] and headers.get("Server", "").startswith("nginx")
            assert f.read(10) == blob[:10]
            assert f.http_response_latencies == f.response_latencies and len(f.response_latencies) == 1
            assert f.popen_latencies == []  # no curl process here
            f.register_error_context("the presigned URL may have expired")
            f.seek(3 << 20)  # too far to continue the open response: a new request
            with pytest.raises(OSError, match="(?s)403.*the presigned URL may have expired"):
                f.read(10)


def test_verify_reads_a_url_and_names_the_bad_tensor(site):
    # What `python -m tensorizer verify URL` runs: every hash, over ranged GETs.
    from tensorizer import _verify

    good = _verify.verify_file(site["nginx"].url("many.tensors"))
    assert good.ok and good.tensors == len(site["many"])
    bad = _verify.verify_file(site["nginx"].url("bad.tensors"))
    assert len(bad.failures) == 1 and "'t100'" in bad.failures[0]


def test_curl_stream_file_checks_its_arguments(site):
    url = site["nginx"].url("plain.tensors")
    with pytest.raises(ValueError, match="begin"):
        stream_io.CURLStreamFile(url, begin=-1)
    with pytest.raises(ValueError, match="strictly after"):
        stream_io.CURLStreamFile(url, begin=10, end=10)
    with pytest.raises(ValueError, match="http"):
        stream_io.CURLStreamFile("s3://bucket/key")
    with pytest.raises(ValueError, match="header"):
        stream_io.CURLStreamFile(url, headers={"X-A": "1\r\nX-Injected: 1"})
    with pytest.raises(FileNotFoundError):
        stream_io.CURLStreamFile(site["nginx"].url("missing.tensors"))


def test_open_stream_certificate_handling(site):
    from tensorizer import stream_io

    url = site["nginx"].url("plain.tensors", tls=True)
    with stream_io.open_stream(url, certificate_handling=stream_io.CAInfo(cacert=str(site["tls"]["ca"]))) as f:
        assert f.read(5) == b"|TZR|"
    with stream_io.open_stream(url, certificate_handling=stream_io.CAInfo(allow_untrusted=True)) as f:
        with TensorDeserializer(f) as t:
            _check(t, site["sd"])
    with pytest.raises(ValueError):
        stream_io.CAInfo()
    # Checked at construction, as upstream does; curl_flags as upstream's.
    with pytest.raises(ValueError, match="cacert"):
        stream_io.CAInfo(cacert=str(site["root"] / "no-such-ca.pem"))
    with pytest.raises(ValueError, match="capath"):
        stream_io.CAInfo(capath=str(site["root"] / "no-such-dir"))
    assert stream_io.CAInfo(cacert=str(site["tls"]["ca"])).curl_flags == ("--cacert", str(site["tls"]["ca"]))
    assert stream_io.CAInfo(capath=str(site["root"])).curl_flags == ("--capath", str(site["root"]))
    assert stream_io.CAInfo(allow_untrusted=True).curl_flags == ("--insecure",)
