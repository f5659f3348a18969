import os

import pytest

from tensorizer import stream_io


def test_local_write_creates_parents(tmp_path):
    target = tmp_path / "a" / "b" / "file.bin"
    with stream_io.open_stream(str(target), "wb") as f:
        f.write(b"hello world")
    assert target.read_bytes() == b"hello world"


def test_pathlike_and_begin(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"0123456789")
    with stream_io.open_stream(target, "rb", begin=4) as f:
        assert f.read() == b"456789"


def test_file_uri(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"abc")
    with stream_io.open_stream(f"file://{target}") as f:
        assert f.read() == b"abc"
    with stream_io.open_stream(f"file://localhost{target}") as f:
        assert f.read() == b"abc"


def test_binary_mode_required(tmp_path):
    with pytest.raises(ValueError, match="binary modes"):
        stream_io.open_stream(str(tmp_path / "x"), "w")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        stream_io.open_stream(str(tmp_path / "missing"))


def test_s3_write_streams_are_lazy():
    # Nothing is contacted until the first write; closing an unused stream creates nothing.
    f = stream_io.open_stream("s3://bucket/key", "wb")
    assert isinstance(f, stream_io.RemoteWriteStream) and f.writable() and f.tell() == 0
    f.close()
    assert f.closed


def test_write_plus_mode(tmp_path):
    target = tmp_path / "sub" / "f.bin"
    with stream_io.open_stream(str(target), "wb+") as f:
        f.write(b"xyz")
        f.seek(0)
        assert f.read() == b"xyz"
    assert os.path.getsize(target) == 3


# ---------------------------------------------------------------------------
# S3 helpers with upstream's names: s3cmd config, endpoint scheme, presigning


@pytest.fixture
def home(tmp_path, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def _s3cfg(path, **entries):
    path.write_text("[default]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))
    return path


def test_infer_credentials(home):
    # Both given: nothing is read.
    assert stream_io._infer_credentials("a", "b") == (None, None, "a", "b", None)
    with pytest.raises(ValueError, match="no default .s3cfg"):
        stream_io._infer_credentials(None, None)
    cfg = _s3cfg(home / ".s3cfg", access_key="AK", secret_key="S%K", host_base="h:9", use_https="False")
    assert stream_io._infer_credentials(None, None) == (str(cfg), "h:9", "AK", "S%K", False)
    # A given key wins over the config's; as upstream, an empty one completed
    # from a config is refused (both "" is for public buckets).
    assert stream_io._infer_credentials("mine", None)[2:4] == ("mine", "S%K")
    with pytest.raises(ValueError, match="s3_secret_access_key was not provided"):
        stream_io._infer_credentials(None, "")
    with pytest.raises(FileNotFoundError):
        stream_io._infer_credentials(None, None, home / "absent.cfg")
    _s3cfg(home / "partial.cfg", access_key="AK")
    with pytest.raises(ValueError, match="s3_secret_access_key"):
        stream_io._infer_credentials(None, None, home / "partial.cfg")
    (home / "nosection.cfg").write_text("[other]\naccess_key = x\n")
    with pytest.raises(ValueError, match="could not be parsed"):
        stream_io._infer_credentials(None, None, home / "nosection.cfg")


def test_default_config_paths_are_consulted_at_each_call(home, monkeypatch):
    _s3cfg(home / ".s3cfg", access_key="home", secret_key="home")
    _s3cfg(home / "second.cfg", access_key="second", secret_key="second")
    assert stream_io._infer_credentials(None, None).s3_access_key == "home"
    monkeypatch.setattr(stream_io, "_s3_default_config_paths", (str(home / "missing"), str(home / "second.cfg")))
    assert stream_io._infer_credentials(None, None).s3_access_key == "second"
    monkeypatch.setattr(stream_io, "_s3_default_config_paths", ())
    with pytest.raises(ValueError):
        stream_io._infer_credentials(None, None)
    # The native side is kept away from ~/.s3cfg too: "" makes it read none.
    opts = stream_io.http_options("s3://b/k")
    assert opts["s3_config_path"] == "" and "s3_access_key_id" not in opts


def test_s3cfg_settings_become_options(home):
    _s3cfg(home / ".s3cfg", access_key="AK", secret_key="SK", host_base="store:9000", use_https="False")
    opts = stream_io.http_options("s3://b/k")
    assert opts["s3_access_key_id"] == "AK" and opts["s3_secret_access_key"] == "SK"
    assert opts["s3_endpoint"] == "http://store:9000" and opts["s3_force_http"] == "1"
    # An explicit endpoint wins; https unless asked otherwise.
    opts = stream_io._s3_open_options("a", "b", "other.example", None, None, None)
    assert opts["s3_endpoint"] == "https://other.example" and opts["s3_force_http"] == "0"


def test_enforce_scheme():
    enforce = stream_io._enforce_scheme
    assert enforce("host:1") == "https://host:1"
    assert enforce("host:1", force_http=True) == "http://host:1"
    assert enforce("https://host") == "https://host"
    assert enforce("HTTPS://host", force_http=True) == "http://host"
    assert enforce("http://host", allow_http=True) == "http://host"
    assert enforce("http://host", force_http=True) == "http://host"
    for bad in ("http://host", "ftp://host"):
        with pytest.raises(ValueError, match="Non-HTTPS"):
            enforce(bad)


def test_a_patched_enforce_scheme_decides(home, monkeypatch):
    with pytest.raises(ValueError, match="Non-HTTPS"):
        stream_io._s3_open_options("a", "b", "http://127.0.0.1:9", None, None, None)
    calls = []
    monkeypatch.setattr(stream_io, "_enforce_scheme", lambda endpoint, *rest: calls.append(rest) or endpoint)
    opts = stream_io._s3_open_options("a", "b", "http://127.0.0.1:9", None, None, None)
    assert calls == [(False, False)]
    assert opts["s3_endpoint"] == "http://127.0.0.1:9" and opts["s3_force_http"] == "1"


def test_presign_v4_matches_the_aws_documentation_example():
    # AWS S3 docs, "Authenticating Requests: Using Query Parameters (SigV4)".
    query = stream_io._presign_v4(
        "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", None,
        "examplebucket.s3.amazonaws.com", "/test.txt", "us-east-1", "20130524T000000Z", 86400,
    )
    assert query == (
        "X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
        "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
        "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
    )


@pytest.mark.parametrize("version", ["s3v4", "s3"])
def test_presigned_urls_match_botocore(version):
    session = pytest.importorskip("botocore.session")
    import urllib.parse

    from botocore.config import Config

    client = session.get_session().create_client(
        "s3", endpoint_url="http://127.0.0.1:5000", aws_access_key_id="AK", aws_secret_access_key="SK",
        region_name="eu-west-2", config=Config(signature_version=version),
    )
    theirs = urllib.parse.urlsplit(client.generate_presigned_url(
        "get_object", Params={"Bucket": "b", "Key": "dir/a b+c~.tensors"}, ExpiresIn=1000))
    q = dict(urllib.parse.parse_qsl(theirs.query))
    if version == "s3":
        mine = stream_io._presign_v2("AK", "SK", theirs.path, int(q["Expires"]))
    else:
        mine = stream_io._presign_v4("AK", "SK", None, theirs.netloc, theirs.path, "eu-west-2",
                                     q["X-Amz-Date"], int(q["X-Amz-Expires"]))
    assert dict(urllib.parse.parse_qsl(mine)) == q


def test_s3_download_url(home):
    url = stream_io._s3_download_url("s3://bucket/dir/m v1.tensors", "AK", "SK", "http://127.0.0.1:5000")
    assert url.startswith("http://127.0.0.1:5000/bucket/dir/m%20v1.tensors?X-Amz-Algorithm=AWS4-HMAC-SHA256&")
    assert "X-Amz-Credential=AK%2F" in url and "%2Fus-east-1%2Fs3%2F" in url
    # Expiry on a day boundary, at least a day away (upstream's caching rule).
    import calendar
    import time
    import urllib.parse

    q = dict(urllib.parse.parse_qsl(url.split("?", 1)[1]))

    signed = calendar.timegm(time.strptime(q["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))
    expires = signed + int(q["X-Amz-Expires"])
    assert expires % 86400 == 0 and 86400 < expires - signed <= 2 * 86400
    # accel-object endpoints get version-2 signatures; no scheme means https.
    url = stream_io._s3_download_url("s3://bucket/k", "AK", "SK", "accel-object.ord1.coreweave.com")
    assert url.startswith("https://accel-object.ord1.coreweave.com/bucket/k?AWSAccessKeyId=AK&Signature=")
    # Virtual-hosted buckets where path-style is not served.
    assert stream_io._s3_download_url("s3://bucket/k", "", "", "cwobject.com") == "https://bucket.cwobject.com/k"
    # Unsigned: "" credentials, or none given and none in the environment.
    assert stream_io._s3_download_url("s3://bucket/k", None, None, "https://h") == "https://h/bucket/k"
    with pytest.raises(ValueError, match="s3_signature_version"):
        stream_io._s3_download_url("s3://bucket/k", "AK", "SK", "h", s3_signature_version="v9")
    with pytest.raises(ValueError, match="Invalid S3 URI"):
        stream_io._s3_download_url("https://h/k", "AK", "SK", "h")
