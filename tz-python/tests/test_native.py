import pytest


def test_version():
    import tensorizer
    from tensorizer import _native

    assert tensorizer.__version__ == "2.12.1"
    v = tensorizer.__native_version__
    assert v.count(".") == 2
    assert _native.lib.TZ_DATA_VERSION_MAX == 5


@pytest.mark.parametrize(
    "code,exc",
    [
        ("TZ_E_FORMAT", ValueError),
        ("TZ_E_TRUNCATED", ValueError),
        ("TZ_E_CONFLICT", ValueError),
        ("TZ_E_INVALID_ARG", ValueError),
        ("TZ_E_UNSUPPORTED", ValueError),
        ("TZ_E_IO", OSError),
        ("TZ_E_NOT_FOUND", FileNotFoundError),
        ("TZ_E_LIMIT", RuntimeError),
        ("TZ_E_NOMEM", MemoryError),
        ("TZ_E_STATE", RuntimeError),
        ("TZ_E_INTERNAL", RuntimeError),
    ],
)
def test_error_mapping(code, exc):
    from tensorizer import _native

    rc = getattr(_native.lib, code)
    with pytest.raises(exc, match="boom"):
        _native.raise_error(rc, "boom")


def test_special_errors():
    from tensorizer import CryptographyError, _crypt, _native
    from tensorizer.serialization import HashMismatchError, _FileHeader

    lib = _native.lib
    with pytest.raises(_FileHeader.InvalidVersionError) as info:
        _native.raise_error(
            lib.TZ_E_VERSION,
            "Unsupported version: this data stream uses tensorizer data version 7, ...",
        )
    assert info.value.version == 7
    assert isinstance(info.value, ValueError)
    with pytest.raises(HashMismatchError):
        _native.raise_error(lib.TZ_E_HASH, "x")
    with pytest.raises(CryptographyError) as info:
        _native.raise_error(lib.TZ_E_CRYPTO, "x")
    assert isinstance(info.value, _crypt.CryptographyError)
    assert _native.check(0) == 0


def test_status_names():
    from tensorizer import _native

    assert _native.ffi.string(_native.lib.tz_status_name(_native.lib.TZ_E_HASH)) == b"TZ_E_HASH"


def test_structs_without_a_version_are_rejected():
    # cffi zero-fills new structs, so a caller that forgets `.version` sends 0.
    from pathlib import Path

    from tensorizer import _native

    lib, ffi = _native.lib, _native.ffi
    vector = Path(__file__).resolve().parents[2] / "tests" / "vectors" / "v4_meta.tensors"
    out = ffi.new("tz_reader **")
    _native.check(lib.tz_reader_open(out, str(vector).encode(), ffi.NULL))
    reader = ffi.gc(out[0], lib.tz_reader_free)

    info = ffi.new("tz_file_info *")
    assert lib.tz_reader_file_info(info, reader) == lib.TZ_E_INVALID_ARG
    assert "tz_file_info.version is 0" in _native.error_message()
    info.version = lib.TZ_FILE_INFO_VERSION
    _native.check(lib.tz_reader_file_info(info, reader))
    assert info.tensor_count > 0

    requests = ffi.new("tz_read_request[]", 1)
    assert lib.tz_reader_read_batch(reader, requests, 1, 0, 0, ffi.NULL) == lib.TZ_E_INVALID_ARG
    assert "tz_read_request.version" in _native.error_message()
