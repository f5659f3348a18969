"""
Opening tensorizer sources and targets as file-like objects.

``open_stream`` opens local files (plain paths, ``os.PathLike`` objects and
``file://`` URIs). ``TensorDeserializer`` also reads ``http://`` and
``https://`` URLs directly (the native reader fetches byte ranges itself);
file objects for remote schemes (``http(s)://``, ``s3://``, ``redis://``)
are not supported by this build yet.
"""

import io
import os
import typing
import urllib.parse
from typing import Optional, Union

__all__ = ["open_stream", "CAInfo", "RemoteStreamFile", "RemoteWriteStream"]

_REMOTE_SCHEMES = ("http", "https", "s3", "redis")


def _split_scheme(path_uri: str):
    scheme, *location = path_uri.split("://", maxsplit=1)
    if not location:
        return None, path_uri
    return scheme.lower(), location[0]


def _file_uri_to_path(location: str, original: str) -> str:
    # location is what follows "file://": "[host]/path"
    if location.startswith("/"):
        return urllib.parse.unquote(location)
    host, sep, rest = location.partition("/")
    if host.lower() in ("", "localhost"):
        return urllib.parse.unquote("/" + rest)
    raise ValueError(
        f"Unsupported file:// URI {original!r}: only local files can be opened"
    )


def local_path(path_uri: Union[str, bytes, os.PathLike]) -> Optional[str]:
    """
    The local filesystem path `path_uri` refers to, or None if it is a
    URI of a remote scheme.
    """
    if isinstance(path_uri, os.PathLike):
        return os.fsdecode(os.fspath(path_uri))
    if isinstance(path_uri, bytes):
        path_uri = os.fsdecode(path_uri)
    scheme, location = _split_scheme(path_uri)
    if scheme is None:
        return path_uri
    if scheme == "file":
        return _file_uri_to_path(location, path_uri)
    if scheme in _REMOTE_SCHEMES:
        return None
    # Unknown schemes are treated as plain local paths, as upstream does.
    return path_uri


# Schemes libtensorizer reads natively.
_NATIVE_REMOTE_SCHEMES = ("http", "https", "redis", "s3")


def http_url(path_uri: Union[str, bytes, os.PathLike]) -> Optional[str]:
    """`path_uri` itself if it is a URL libtensorizer reads natively
    (http://, https://, redis://, s3://), else None."""
    if isinstance(path_uri, os.PathLike):
        return None
    if isinstance(path_uri, bytes):
        path_uri = os.fsdecode(path_uri)
    scheme, _ = _split_scheme(path_uri)
    return path_uri if scheme in _NATIVE_REMOTE_SCHEMES else None


class CAInfo:
    """
    TLS certificate verification for https:// streams, as upstream's API:
    exactly one of ``cacert`` (a PEM bundle), ``capath`` (a hashed
    certificate directory) or ``allow_untrusted=True`` (no verification).
    Pass ``certificate_handling=None`` for the system's trust store.
    """

    __slots__ = ("cacert", "capath", "allow_untrusted")

    def __init__(
        self,
        *,
        cacert: Optional[str] = None,
        capath: Optional[str] = None,
        allow_untrusted: bool = False,
    ):
        if (cacert, capath).count(None) + (not allow_untrusted) != 2:
            raise ValueError(
                "Exactly one of cacert, capath, or allow_untrusted=True"
                " must be specified. For default certificate verification"
                " behaviour, use certificate_handling=None instead of"
                " an explicit CAInfo instance"
            )
        self.cacert = cacert
        self.capath = capath
        self.allow_untrusted = bool(allow_untrusted)

    def options(self) -> dict:
        """libtensorizer source options for this setting."""
        if self.allow_untrusted:
            return {"tls_verify": "0"}
        if self.cacert is not None:
            return {"ca_file": os.fspath(self.cacert)}
        return {"ca_dir": os.fspath(self.capath)}


def http_options(url: str, certificate_handling: Optional[CAInfo] = None) -> dict:
    """libtensorizer options for an http(s) URL: `certificate_handling`, or,
    like the curl tool upstream runs, CURL_CA_BUNDLE / SSL_CERT_FILE /
    SSL_CERT_DIR from the environment."""
    if certificate_handling is not None:
        if not isinstance(certificate_handling, CAInfo):
            raise TypeError(
                "certificate_handling: expected CAInfo or None,"
                f" got {certificate_handling.__class__.__name__}"
            )
        return certificate_handling.options()
    if not url.lower().startswith("https://"):
        return {}
    values = {}
    ca_file = os.environ.get("CURL_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE")
    if ca_file:
        values["ca_file"] = ca_file
    ca_dir = os.environ.get("SSL_CERT_DIR")
    if ca_dir:
        values["ca_dir"] = ca_dir
    return values


def s3_options(
    access_key_id: Optional[str] = None,
    secret_access_key: Optional[str] = None,
    endpoint: Optional[str] = None,
    config_path: Optional[Union[str, bytes, os.PathLike]] = None,
    force_http: Optional[bool] = None,
    region: Optional[str] = None,
) -> dict:
    """libtensorizer options for an s3:// URI; what is left out is resolved
    natively (s3cmd config, AWS environment and files, as upstream)."""
    values = {}
    if access_key_id is not None:
        values["s3_access_key_id"] = access_key_id
    if secret_access_key is not None:
        values["s3_secret_access_key"] = secret_access_key
    if endpoint is not None:
        values["s3_endpoint"] = endpoint
    if config_path is not None:
        values["s3_config_path"] = os.fsdecode(os.fspath(config_path))
    if force_http is not None:
        values["s3_force_http"] = "1" if force_http else "0"
    if region is not None:
        values["s3_region"] = region
    return values


def _native_options(values: dict):
    """A tz_options handle holding `values` (freed with the returned object)."""
    from . import _native
    from ._native import ffi

    lib = _native.lib
    opts_p = ffi.new("tz_options **")
    _native.check(lib.tz_options_new(opts_p))
    opts = ffi.gc(opts_p[0], lib.tz_options_free)
    for k, v in values.items():
        _native.check(lib.tz_options_set(opts, k.encode(), str(v).encode()))
    return opts


class _NativeStream(io.RawIOBase):
    """What the remote file objects share: the URI and options libtensorizer
    opens, and an absolute position."""

    def __init__(self, url: str, options: dict):
        super().__init__()
        from . import _native
        from ._native import ffi

        self._native, self._ffi = _native, ffi
        self._tz_uri = url
        self._tz_options = dict(options)
        self._pos = 0
        self.name = url

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def _transfer(self, fn, handle, view, n: int) -> int:
        """fn(handle, position, buffer, n) on the first n bytes of `view`; advances."""
        buf = self._ffi.from_buffer(view)
        try:
            self._native.check(fn(handle, self._pos, buf, n))
        finally:
            self._ffi.release(buf)
        self._pos += n
        return n


class RemoteStreamFile(_NativeStream):
    """
    A read-only, seekable file object over an http(s) URL: each read is a
    ranged GET through libtensorizer (pooled connections, retries that
    resume, TLS verification), written straight into the caller's buffer
    with the GIL released. Positions are absolute; ``begin``/``end`` bound
    the readable range. A ``TensorDeserializer`` given this object reads the
    URL natively, with these options.
    """

    def __init__(self, url: str, options: dict, begin: Optional[int] = None, end: Optional[int] = None):
        super().__init__(url, options)
        _native, ffi = self._native, self._ffi
        lib = _native.lib
        opts = _native_options(self._tz_options)
        out = ffi.new("tz_source **")
        rc = lib.tz_source_open(out, url.encode("utf-8"), opts)
        if rc != 0:
            msg = _native.error_message()
            if rc == lib.TZ_E_NOT_FOUND:
                raise FileNotFoundError(msg)
            _native.raise_error(rc, msg)
        self._src = ffi.gc(out[0], lib.tz_source_close)
        size = ffi.new("uint64_t *")
        _native.check(lib.tz_source_size(size, self._src))
        self._size = int(size[0])
        self._begin = 0 if begin is None else int(begin)
        self._end = self._size if end is None else min(int(end), self._size)
        if not 0 <= self._begin <= self._end:
            raise ValueError(f"Invalid range: begin={begin}, end={end} (size {self._size})")
        self._pos = self._begin

    def readable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._end + offset
        else:
            raise ValueError(f"Invalid whence ({whence})")
        if pos < 0:
            raise OSError(f"Negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, buffer) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        with memoryview(buffer) as mv, mv.cast("B") as view:
            n = max(0, min(len(view), self._end - self._pos))
            if n == 0:
                return 0
            return self._transfer(self._native.lib.tz_source_read, self._src, view, n)

    def close(self) -> None:
        if not self.closed and getattr(self, "_src", None) is not None:
            self._ffi.release(self._src)  # runs tz_source_close now
            self._src = None
        super().close()


class RemoteWriteStream(_NativeStream):
    """
    A write-only file object for an s3:// URI: bytes stream into a multipart
    upload (parts are sent as they fill); ``close()`` completes it, and the
    object appears only then. Leaving through an exception in a ``with``
    block aborts the upload. A ``TensorSerializer`` given this object before
    anything was written to it writes the URI natively instead.
    """

    def __init__(self, url: str, options: dict):
        super().__init__(url, options)
        self._sink = None  # opened on the first write

    def writable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._pos
        elif whence != io.SEEK_SET:
            raise io.UnsupportedOperation("S3 write streams seek from the start or the current position")
        if offset < 0:
            raise OSError(f"Negative seek position {offset}")
        self._pos = offset
        return offset

    def _open(self):
        lib, ffi = self._native.lib, self._ffi
        opts = _native_options(self._tz_options)
        out = ffi.new("tz_sink **")
        self._native.check(lib.tz_sink_open(out, self._tz_uri.encode("utf-8"), opts))
        self._sink = ffi.gc(out[0], lib.tz_sink_free)

    def write(self, data) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        with memoryview(data) as mv, mv.cast("B") as view:
            n = len(view)
            if n == 0:
                return 0
            if self._sink is None:
                self._open()
            return self._transfer(self._native.lib.tz_sink_write, self._sink, view, n)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._sink is not None:
                self._native.check(self._native.lib.tz_sink_close(self._sink))
        finally:
            if self._sink is not None:
                self._ffi.release(self._sink)
                self._sink = None
            super().close()

    def abort(self) -> None:
        """Drops the upload: no object is created."""
        if self._sink is not None:
            self._ffi.release(self._sink)  # tz_sink_free aborts an unfinished upload
            self._sink = None
        super().close()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
            return None
        return super().__exit__(exc_type, exc, tb)


def _unsupported_scheme(path_uri: str) -> ValueError:
    scheme, _ = _split_scheme(path_uri)
    return ValueError(
        f"The {scheme}:// scheme ({path_uri!r}) is not supported by this build"
        " yet; only local files can be opened"
    )


def open_stream(
    path_uri: Union[str, bytes, os.PathLike, int],
    mode: str = "rb",
    s3_access_key_id: Optional[str] = None,
    s3_secret_access_key: Optional[str] = None,
    s3_endpoint: Optional[str] = None,
    s3_config_path: Optional[Union[str, bytes, os.PathLike]] = None,
    buffer_size: Optional[int] = None,
    force_http: Optional[bool] = None,
    *,
    begin: Optional[int] = None,
    end: Optional[int] = None,
    s3_region_name: Optional[str] = None,
    s3_signature_version: Optional[str] = None,
    certificate_handling=None,
) -> typing.BinaryIO:
    """
    Open a local file path (or ``file://`` URI) or an http(s):// URL as a
    binary stream.

    Args:
        path_uri: The path or URI to open. An ``int`` is taken as an open
            file descriptor (which stays owned by the caller).
        mode: A binary mode ("rb", "wb", "wb+", "ab", ...). With "w", "a"
            or "x", missing parent directories are created.
        buffer_size: Buffer size for the file object
            (default ``io.DEFAULT_BUFFER_SIZE``).
        begin: Offset to seek to after opening.
        end: Ignored for local files.
        certificate_handling: ``CAInfo`` for https:// URLs (None: the
            system's trust store, or CURL_CA_BUNDLE / SSL_CERT_FILE).
        s3_access_key_id, s3_secret_access_key, s3_endpoint, s3_config_path,
        force_http, s3_region_name, s3_signature_version: for s3:// URIs,
            which this build does not open yet.

    http(s):// URLs open read-only, as a buffered ``RemoteStreamFile``.

    Returns:
        An open file object.

    Raises:
        ValueError: For a non-binary mode, or a remote URI scheme.
    """
    normalized_mode = "".join(sorted(mode))

    if isinstance(path_uri, int) and not isinstance(path_uri, bool):
        target: Union[str, int] = path_uri
        closefd = False
    else:
        if not isinstance(path_uri, (str, bytes, os.PathLike)):
            raise TypeError(
                "path_uri: expected str, bytes, os.PathLike or int,"
                f" got {path_uri.__class__.__name__}"
            )
        url = http_url(path_uri)
        if url is not None:
            is_s3 = url.lower().startswith("s3://")
            options = http_options(url, certificate_handling)
            if is_s3:
                options.update(
                    s3_options(
                        s3_access_key_id,
                        s3_secret_access_key,
                        s3_endpoint,
                        s3_config_path,
                        force_http,
                        s3_region_name,
                    )
                )
            if any(map(normalized_mode.__contains__, "wax+")):
                if is_s3:
                    return typing.cast(typing.BinaryIO, RemoteWriteStream(url, options))
                raise ValueError(
                    f"Cannot open {url.split('?')[0].split('@')[-1]!r} for writing:"
                    " http(s) and redis streams are read-only (use to_redis to write Redis)"
                )
            raw = RemoteStreamFile(url, options, begin, end)
            if buffer_size == 0:
                return typing.cast(typing.BinaryIO, raw)
            return typing.cast(
                typing.BinaryIO,
                io.BufferedReader(raw, buffer_size or (16 << 20)),
            )
        target = local_path(path_uri)
        if target is None:
            raise _unsupported_scheme(
                path_uri if isinstance(path_uri, str) else os.fsdecode(path_uri)
            )
        closefd = True

    if "b" not in normalized_mode:
        raise ValueError(
            'Only binary modes ("rb", "wb", "wb+", etc.)'
            " are valid when opening local file streams."
        )
    if isinstance(target, str) and any(map(normalized_mode.__contains__, "wax")):
        dirname = os.path.dirname(target)
        if dirname:
            os.makedirs(dirname, exist_ok=True)
    if buffer_size is None:
        buffer_size = io.DEFAULT_BUFFER_SIZE
    handle = open(target, mode, buffering=buffer_size, closefd=closefd)
    try:
        handle.seek(begin or 0)
    except Exception:
        handle.close()
        raise
    return typing.cast(typing.BinaryIO, handle)
