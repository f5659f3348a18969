"""Reading s3:// objects from moto's S3 server on loopback: SigV4-signed
ranged GETs, several readers, credentials from each source of the
resolution order, and clear errors."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import servers
from tensorizer import TensorDeserializer, TensorSerializer, stream_io

pytestmark = [
    pytest.mark.ours_only,  # upstream reads S3 through boto3 presigned URLs and the curl tool
    pytest.mark.skipif(importlib.util.find_spec("moto") is None, reason="moto is not installed"),
]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with servers.MotoS3() as server:
        root = tmp_path_factory.mktemp("s3src")
        sd = {"big": torch.randn(3 * 1024 * 1024 + 1), "name with space": torch.arange(10)}
        path = root / "m.tensors"
        with TensorSerializer(path) as s:
            s.write_state_dict(sd)
        client = server.client()
        client.create_bucket(Bucket="bucket")
        client.upload_file(str(path), "bucket", "dir/model v1.tensors")
        yield {"server": server, "sd": sd, "uri": "s3://bucket/dir/model v1.tensors"}


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
                "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.s3cfg or ~/.aws
    return monkeypatch


def _check(t, sd):
    assert set(t.keys()) == set(sd)
    for k, v in sd.items():
        assert torch.equal(t[k], v), k


@pytest.mark.parametrize("num_readers", [1, 4])
def test_read_with_environment_credentials(s3, clean_env, num_readers):
    clean_env.setenv("AWS_ACCESS_KEY_ID", "testing")
    clean_env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    clean_env.setenv("AWS_ENDPOINT_URL", s3["server"].endpoint)  # plain http allowed from the env
    with TensorDeserializer(s3["uri"], num_readers=num_readers, verify_hash=True) as t:
        _check(t, s3["sd"])


@pytest.mark.parametrize("order", [list, lambda names: list(reversed(names))])
def test_lazy_load_in_and_against_file_order(s3, clean_env, order):
    # Lazy reads going on forward continue or open signed open-ended GETs;
    # reads going back use signed closed ranges.
    clean_env.setenv("AWS_ACCESS_KEY_ID", "testing")
    clean_env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    clean_env.setenv("AWS_ENDPOINT_URL", s3["server"].endpoint)
    with TensorDeserializer(s3["uri"], lazy_load=True, verify_hash=True) as t:
        for name in order(list(s3["sd"])):
            assert torch.equal(t[name], s3["sd"][name]), name


def test_open_stream_with_explicit_arguments(s3, clean_env):
    with stream_io.open_stream(s3["uri"], "rb", s3_access_key_id="testing", s3_secret_access_key="testing",
                               s3_endpoint=s3["server"].endpoint, force_http=True) as f:
        assert f.read(5) == b"|TZR|"
        f.seek(0)
        with TensorDeserializer(f) as t:
            _check(t, s3["sd"])
    # An explicit http:// endpoint needs force_http, as upstream.
    with pytest.raises(ValueError, match="Non-HTTPS"):
        stream_io.open_stream(s3["uri"], s3_access_key_id="a", s3_secret_access_key="b",
                              s3_endpoint=s3["server"].endpoint)


def test_s3cfg_credentials_and_endpoint(s3, clean_env, tmp_path):
    host = s3["server"].endpoint.split("://")[1]
    (tmp_path / ".s3cfg").write_text(f"[default]\naccess_key = testing\nsecret_key = testing\n"
                                     f"host_base = {host}\nuse_https = False\n")
    with TensorDeserializer(s3["uri"]) as t:
        _check(t, s3["sd"])


def test_shared_credentials_file_and_config_endpoint(s3, clean_env, tmp_path):
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\naws_access_key_id = testing\n"
                                                   "aws_secret_access_key = testing\n")
    (tmp_path / ".aws" / "config").write_text(f"[default]\nregion = us-east-1\n"
                                              f"endpoint_url = {s3['server'].endpoint}\n")
    with TensorDeserializer(s3["uri"]) as t:
        _check(t, s3["sd"])


def test_missing_object_and_bucket(s3, clean_env):
    clean_env.setenv("AWS_ACCESS_KEY_ID", "testing")
    clean_env.setenv("AWS_SECRET_ACCESS_KEY", "topsecret-value")
    clean_env.setenv("AWS_ENDPOINT_URL", s3["server"].endpoint)
    with pytest.raises(FileNotFoundError, match="404") as ei:
        TensorDeserializer("s3://bucket/nope.tensors")
    assert "topsecret" not in str(ei.value)
    with pytest.raises(FileNotFoundError):
        TensorDeserializer("s3://no-such-bucket/x.tensors")


def test_signatures_are_checked_and_a_wrong_secret_is_a_clear_error(clean_env, tmp_path):
    with servers.MotoS3(enforce_auth=True) as server:
        key_id, secret = server.make_user()
        client = server.client(key_id, secret)
        client.create_bucket(Bucket="private")
        path = tmp_path / "p.tensors"
        with TensorSerializer(path) as s:
            s.write_state_dict({"w": torch.arange(1000)})
        client.upload_file(str(path), "private", "p.tensors")
        common = dict(s3_endpoint=server.endpoint, force_http=True)
        with stream_io.open_stream("s3://private/p.tensors", s3_access_key_id=key_id,
                                   s3_secret_access_key=secret, **common) as f:
            with TensorDeserializer(f, verify_hash=True) as t:
                assert torch.equal(t["w"], torch.arange(1000))
        with pytest.raises(OSError, match="403") as ei:
            stream_io.open_stream("s3://private/p.tensors", s3_access_key_id=key_id,
                                  s3_secret_access_key="wrong-secret-value", **common)
        assert "wrong-secret-value" not in str(ei.value) and secret not in str(ei.value)
        # Anonymous access to a private bucket is refused too.
        with pytest.raises(OSError, match="403"):
            stream_io.open_stream("s3://private/p.tensors", s3_config_path=str(tmp_path / "none"), **common)


def _env(clean_env, server):
    clean_env.setenv("AWS_ACCESS_KEY_ID", "testing")
    clean_env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    clean_env.setenv("AWS_ENDPOINT_URL", server.endpoint)


def test_streaming_multipart_write_then_read(s3, clean_env):
    _env(clean_env, s3["server"])
    g = torch.Generator().manual_seed(5)
    # About 40 MiB: the 16 MiB parts stream out while writing; the head part goes last.
    sd = {f"w{i}": torch.randn(1024 * 1024, generator=g) for i in range(10)}
    sd["meta"] = torch.empty(3, device="meta")
    uri = "s3://bucket/written/model.tensors"
    with TensorSerializer(uri) as s:
        s.write_state_dict(sd)
    head = s3["server"].client().head_object(Bucket="bucket", Key="written/model.tensors")
    assert head["ContentLength"] > 40 * 1024 * 1024
    assert "-" in head["ETag"]  # a multipart object
    with TensorDeserializer(uri, verify_hash=True, num_readers=4) as t:
        for k, v in sd.items():
            assert torch.equal(t[k], torch.zeros(3) if k == "meta" else v), k


def test_several_write_calls_and_a_small_file(s3, clean_env):
    _env(clean_env, s3["server"])
    uri = "s3://bucket/written/calls.tensors"
    s = TensorSerializer(uri)
    s.write_tensor(0, "a", 0, torch.arange(10))
    s.write_tensor(1, "b", 0, torch.ones(5))
    s.close()
    with TensorDeserializer(uri, verify_hash=True) as t:
        assert torch.equal(t["a"], torch.arange(10)) and torch.equal(t["b"], torch.ones(5))


def test_a_failed_save_aborts_the_upload_and_leaves_no_object(s3, clean_env):
    # Through a proxy: the upload starts, the first part upload is refused
    # (403, not retried), and the abort that follows goes through. A
    # previous object at the key stays as it was.
    server = s3["server"]
    client = server.client()
    old = b"previous checkpoint"
    client.put_object(Bucket="bucket", Key="written/kept.tensors", Body=old)
    with servers.FaultProxy(server.port, [("ok",), ("status", 403), ("ok",)]) as proxy:
        _env(clean_env, server)
        clean_env.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")
        s = TensorSerializer("s3://bucket/written/kept.tensors")
        with pytest.raises(OSError, match="403"):
            s.write_state_dict({"big": torch.randn(10 * 1024 * 1024)})
            s.close()
        s.close()
    assert client.get_object(Bucket="bucket", Key="written/kept.tensors")["Body"].read() == old
    with servers.FaultProxy(server.port, [("ok",), ("status", 403), ("ok",)]) as proxy:
        _env(clean_env, server)
        clean_env.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")
        uri = "s3://bucket/written/failed.tensors"
        s = TensorSerializer(uri)
        with pytest.raises(OSError, match="403"):
            s.write_state_dict({"big": torch.randn(10 * 1024 * 1024)})  # 40 MiB: part 2 fills mid-write
            s.close()  # parts upload in the background: the refusal may only surface here
        s.close()
    client = server.client()
    assert client.list_objects_v2(Bucket="bucket", Prefix="written/failed").get("KeyCount", 0) == 0
    uploads = client.list_multipart_uploads(Bucket="bucket").get("Uploads", [])
    assert [u for u in uploads if u["Key"] == "written/failed.tensors"] == []


def test_open_stream_for_writing(s3, clean_env):
    _env(clean_env, s3["server"])
    client = s3["server"].client()
    args = dict(s3_access_key_id="testing", s3_secret_access_key="testing",
                s3_endpoint=s3["server"].endpoint, force_http=True)
    # Raw bytes, as upstream's temp-file stream would upload them at close.
    payload = bytes(range(256)) * (24 * 1024 * 4)  # 24 MiB: one part goes out while writing
    with stream_io.open_stream("s3://bucket/raw.bin", "wb", **args) as f:
        for i in range(0, len(payload), 1 << 20):
            f.write(payload[i:i + (1 << 20)])
    assert client.get_object(Bucket="bucket", Key="raw.bin")["Body"].read() == payload
    # A serializer given the stream writes the URI natively.
    with stream_io.open_stream("s3://bucket/via-stream.tensors", "wb", **args) as f:
        with TensorSerializer(f) as s:
            s.write_state_dict({"x": torch.arange(100)})
    with TensorDeserializer("s3://bucket/via-stream.tensors") as t:
        assert torch.equal(t["x"], torch.arange(100))
    # An exception inside the block aborts: no object.
    with pytest.raises(RuntimeError):
        with stream_io.open_stream("s3://bucket/aborted.bin", "wb", **args) as f:
            f.write(payload)
            raise RuntimeError("boom")
    assert client.list_objects_v2(Bucket="bucket", Prefix="aborted").get("KeyCount", 0) == 0


def test_s3_upload_and_s3_download(s3, clean_env, tmp_path):
    # Upstream's helpers: explicit credentials and endpoint (any scheme, as boto3 takes).
    endpoint = s3["server"].endpoint
    client = s3["server"].client()
    payload = bytes(range(251)) * (100 * 1024)  # ~24.5 MiB: more than one part
    src = tmp_path / "payload.bin"
    src.write_bytes(payload)
    stream_io.s3_upload(str(src), "s3://bucket/uploaded.bin", "testing", "testing", s3_endpoint=endpoint)
    assert client.get_object(Bucket="bucket", Key="uploaded.bin")["Body"].read() == payload
    # An empty file makes an empty object.
    (tmp_path / "empty.bin").write_bytes(b"")
    stream_io.s3_upload(tmp_path / "empty.bin", "s3://bucket/empty.bin", "testing", "testing", endpoint)
    assert client.head_object(Bucket="bucket", Key="empty.bin")["ContentLength"] == 0

    with stream_io.s3_download("s3://bucket/uploaded.bin", "testing", "testing", endpoint,
                               begin=1000, end=3_000_000) as f:
        assert isinstance(f, stream_io.CURLStreamFile)
        assert f.read() == payload[1000:3_000_000]
        # The object's headers, as upstream's curl-based stream parses them.
        assert f.response_headers["Content-Range"].endswith(f"/{len(payload)}")
        assert f.response_headers["ETag"]
    with stream_io.s3_download(s3["uri"], "testing", "testing", endpoint) as f:
        with TensorDeserializer(f) as t:  # at offset 0: read natively
            _check(t, s3["sd"])
    with pytest.raises(FileNotFoundError):
        stream_io.s3_download("s3://bucket/missing.bin", "testing", "testing", endpoint)
    with pytest.raises(ValueError, match="s3://"):
        stream_io.s3_upload(str(src), "https://example.com/x", "testing", "testing", endpoint)


def test_the_default_endpoints_can_be_changed(s3, clean_env, monkeypatch):
    # Where s3:// goes when nothing names an endpoint: upstream's module defaults.
    monkeypatch.setattr(stream_io, "default_s3_read_endpoint", s3["server"].endpoint)
    monkeypatch.setattr(stream_io, "default_s3_write_endpoint", s3["server"].endpoint)
    args = dict(s3_access_key_id="testing", s3_secret_access_key="testing", force_http=True)
    with stream_io.open_stream("s3://bucket/default-endpoint.bin", "wb", **args) as f:
        f.write(b"through the default endpoint")
    with stream_io.open_stream("s3://bucket/default-endpoint.bin", "rb", **args) as f:
        assert f.read() == b"through the default endpoint"


def test_a_patched_enforce_scheme_allows_a_plain_http_endpoint(s3, clean_env, monkeypatch):
    # Upstream's tests reach plain-http mock servers by replacing _enforce_scheme.
    args = dict(s3_access_key_id="testing", s3_secret_access_key="testing", s3_endpoint=s3["server"].endpoint)
    with pytest.raises(ValueError, match="Non-HTTPS"):
        stream_io.open_stream(s3["uri"], **args)
    monkeypatch.setattr(stream_io, "_enforce_scheme", lambda endpoint, *_: endpoint)
    with stream_io.open_stream(s3["uri"], **args) as f:
        assert f.read(5) == b"|TZR|"
    with stream_io.open_stream("s3://bucket/enforce.bin", "wb", **args) as f:
        f.write(b"written over plain http")
    with stream_io.open_stream("s3://bucket/enforce.bin", **args) as f:
        assert f.read() == b"written over plain http"


def test_patching_the_default_config_paths_keeps_s3cfg_out(s3, clean_env, monkeypatch, tmp_path):
    # ~/.s3cfg names a host that cannot resolve (which fails at once, where a
    # refused port would be retried); with the defaults patched to () it is
    # not read, and the environment's endpoint is used.
    (tmp_path / ".s3cfg").write_text("[default]\naccess_key = testing\nsecret_key = testing\n"
                                     "host_base = s3cfg-endpoint.invalid\nuse_https = False\n")
    clean_env.setenv("AWS_ENDPOINT_URL", s3["server"].endpoint)
    with pytest.raises(OSError, match="s3cfg-endpoint.invalid"):
        TensorDeserializer(s3["uri"])
    monkeypatch.setattr(stream_io, "_s3_default_config_paths", ())
    with TensorDeserializer(s3["uri"]) as t:
        _check(t, s3["sd"])
    with stream_io.open_stream(s3["uri"]) as f:
        assert f.read(5) == b"|TZR|"
    # Or to another file, which is then read instead.
    host = s3["server"].endpoint.split("://")[1]
    clean_env.delenv("AWS_ENDPOINT_URL")
    other = tmp_path / "other.cfg"
    other.write_text(f"[default]\naccess_key = testing\nsecret_key = testing\nhost_base = {host}\nuse_https = False\n")
    monkeypatch.setattr(stream_io, "_s3_default_config_paths", (str(tmp_path / "absent"), str(other)))
    with TensorDeserializer(s3["uri"]) as t:
        _check(t, s3["sd"])


def test_presigned_download_urls_fetch_the_object(s3, clean_env):
    # Signatures are checked against AWS's example and botocore in
    # tz-python/tests/test_stream_io.py; moto's server answers presigned GETs
    # with 500 when it checks auth, so here: the URLs reach the object.
    import urllib.request

    client = s3["server"].client()
    # public-read: moto refuses unsigned GETs of private objects.
    client.put_object(Bucket="bucket", Key="dir/a b+c.bin", Body=b"presigned payload", ACL="public-read")
    endpoint = s3["server"].endpoint
    for keys, version in ((("testing", "testing"), "v4"), (("testing", "testing"), "s3"), (("", ""), None)):
        url = stream_io._s3_download_url("s3://bucket/dir/a b+c.bin", *keys, endpoint, s3_signature_version=version)
        assert ("?" in url) == bool(keys[0])
        with urllib.request.urlopen(url) as r:
            assert r.read() == b"presigned payload"
        # An ordinary http(s) URL for the native reader too.
        with stream_io.open_stream(url) as f:
            assert f.read() == b"presigned payload"
