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
