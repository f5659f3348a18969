"""
Opening tensorizer sources and targets as file-like objects.

``open_stream`` opens local files (plain paths, ``os.PathLike`` objects and
``file://`` URIs) and, through libtensorizer, ``http(s)://``, ``s3://`` and
``redis://`` objects for reading and ``s3://`` objects for writing (a
multipart upload). ``TensorDeserializer`` and ``TensorSerializer`` given such
a URI, or a stream ``open_stream`` returned, read and write it natively.
``CURLStreamFile``, ``RedisStreamFile``, ``s3_download`` and ``s3_upload``
are upstream's names for the same streams.
"""

import http.client
import io
import os
import time
import typing
import urllib.parse
from typing import Optional, Union

__all__ = [
    "open_stream",
    "CURLStreamFile",
    "RedisStreamFile",
    "CAInfo",
    "RemoteStreamFile",
    "RemoteWriteStream",
]

# Where s3:// URIs go when no argument, s3cmd config, environment variable or
# AWS config names an endpoint (upstream's defaults). Read at each call, so
# assigning these changes the default for later streams.
default_s3_read_endpoint = "accel-object.ord1.coreweave.com"
default_s3_write_endpoint = "object.ord1.coreweave.com"

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
        # Checked now, as upstream does, rather than at the first request.
        if cacert is not None and not os.path.isfile(cacert):
            raise ValueError(f"Invalid cacert: {cacert!r} is not a file (a PEM bundle of CA certificates)")
        if capath is not None and not os.path.isdir(capath):
            raise ValueError(f"Invalid capath: {capath!r} is not a directory (of hashed CA certificates)")
        self.cacert = cacert
        self.capath = capath
        self.allow_untrusted = bool(allow_untrusted)

    @property
    def curl_flags(self) -> tuple:
        """The equivalent curl command-line flags (upstream runs curl with them)."""
        if self.allow_untrusted:
            return ("--insecure",)
        if self.cacert is not None:
            return ("--cacert", str(self.cacert))
        return ("--capath", str(self.capath))

    def __hash__(self):
        return hash(self.curl_flags)

    def options(self) -> dict:
        """libtensorizer source options for this setting."""
        if self.allow_untrusted:
            return {"tls_verify": "0"}
        if self.cacert is not None:
            return {"ca_file": os.fspath(self.cacert)}
        return {"ca_dir": os.fspath(self.capath)}


def http_options(
    url: str, certificate_handling: Optional[CAInfo] = None, for_write: bool = False
) -> dict:
    """libtensorizer options for an http(s) or s3 URL: `certificate_handling`,
    or, like the curl tool upstream runs, CURL_CA_BUNDLE / SSL_CERT_FILE /
    SSL_CERT_DIR from the environment; for s3:// the module's current
    default endpoint for reads or writes."""
    scheme = url.split(":", 1)[0].lower()
    values = {}
    if scheme == "s3":
        values["s3_default_endpoint"] = (
            default_s3_write_endpoint if for_write else default_s3_read_endpoint
        )
    if certificate_handling is not None:
        if not isinstance(certificate_handling, CAInfo):
            raise TypeError(
                "certificate_handling: expected CAInfo or None,"
                f" got {certificate_handling.__class__.__name__}"
            )
        values.update(certificate_handling.options())
        return values
    if scheme not in ("https", "s3"):
        return values
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
        opened = time.monotonic()
        rc = lib.tz_source_open(out, url.encode("utf-8"), opts)
        if rc != 0:
            msg = _native.error_message()
            if rc == lib.TZ_E_NOT_FOUND:
                raise FileNotFoundError(msg)
            _native.raise_error(rc, msg)
        self._src = ffi.gc(out[0], lib.tz_source_free)
        size = ffi.new("uint64_t *")
        _native.check(lib.tz_source_size(size, self._src))
        self._size = int(size[0])
        self._begin = 0 if begin is None else int(begin)
        self._end = self._size if end is None else min(int(end), self._size)
        if not 0 <= self._begin <= self._end:
            raise ValueError(f"Invalid range: begin={begin}, end={end} (size {self._size})")
        self._pos = self._begin
        # Upstream's counters. Seeking never reads and discards here (every
        # read asks for its own range), so bytes_skipped stays 0.
        self.bytes_read = 0
        self.bytes_skipped = 0
        self.read_operations = 0
        # Seconds to open the source (for http(s)/s3: the first response,
        # which also brings the object's size), and per read.
        self.setup_latency = time.monotonic() - opened
        self.response_latencies: typing.List[float] = []
        self._error_context: typing.List[str] = []

    @property
    def response_headers(self) -> http.client.HTTPMessage:
        """Headers of the response that opened the stream (empty for redis)."""
        out, length = self._ffi.new("const char **"), self._ffi.new("size_t *")
        self._native.check(self._native.lib.tz_source_response_headers(out, length, self._src))
        raw = self._ffi.unpack(out[0], int(length[0])) if length[0] else b""
        return http.client.parse_headers(io.BytesIO(raw + b"\r\n"))

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
            start = time.monotonic()
            try:
                n = self._transfer(self._native.lib.tz_source_read, self._src, view, n)
            except OSError as e:
                if not self._error_context:
                    raise
                # Same type (all OSErrors take a message), context appended.
                raise type(e)("\n".join([str(e), *self._error_context])) from e
            self.response_latencies.append(time.monotonic() - start)
            self.bytes_read += n
            self.read_operations += 1
            return n

    def close(self) -> None:
        if not self.closed and getattr(self, "_src", None) is not None:
            self._ffi.release(self._src)  # runs tz_source_free now
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


def _require_scheme(uri: str, schemes: typing.Tuple[str, ...], what: str) -> None:
    if not isinstance(uri, str) or uri.split(":", 1)[0].lower() not in schemes:
        raise ValueError(f"{what} takes a {' or '.join(s + '://' for s in schemes)} URI, got {uri!r}")


class _RemoteReader(io.BufferedReader):
    """A buffered reader over a RemoteStreamFile from `begin` to `end`
    (exclusive), with upstream's checks of both, a buffer no larger than the
    range, and upstream's counters."""

    def __init__(
        self,
        url: str,
        options: dict,
        begin: Optional[int],
        end: Optional[int],
        buffer_size: Optional[int],
    ) -> None:
        if begin is not None and begin < 0:
            raise ValueError("Invalid begin, must be non-negative")
        if end is not None and end <= (begin or 0):
            raise ValueError(
                "End marker must come strictly after begin marker"
                f" (requested range: {begin or 0} to {end})"
            )
        size = 16 << 20 if buffer_size is None else buffer_size
        if end is not None:
            size = min(size, end - (begin or 0))
        super().__init__(RemoteStreamFile(url, options, begin, end), max(size, 1))

    bytes_read = property(lambda self: self.raw.bytes_read)
    bytes_skipped = property(lambda self: self.raw.bytes_skipped)
    read_operations = property(lambda self: self.raw.read_operations)
    setup_latency = property(lambda self: self.raw.setup_latency)
    response_latencies = property(lambda self: self.raw.response_latencies)

    def register_error_context(self, msg: str) -> None:
        """Adds `msg` to the message of any read error from now on (upstream's
        way to explain a doubtful setting that may cause a later failure)."""
        self.raw._error_context.append(msg)

    @classmethod
    def _with_options(cls, url, options, begin=None, end=None, buffer_size=None):
        """An instance on options already resolved (open_stream, s3_download:
        upstream returns these classes from both, for http(s)/s3 and redis)."""
        stream = cls.__new__(cls)
        _RemoteReader.__init__(stream, url, options, begin, end, buffer_size)
        return stream


class CURLStreamFile(_RemoteReader):
    """
    Upstream's HTTP(S) stream, built here on libtensorizer's ranged GETs
    instead of a curl process: a buffered, seekable reader of `uri` from
    `begin` to `end` (exclusive), with pooled connections, resuming retries
    and TLS verification (`certificate_handling`). `headers` (a mapping) are
    sent with every request. Seeking anywhere is cheap: each read asks for its
    own range. Counters: ``bytes_read``, ``bytes_skipped``, ``read_operations``,
    and ``setup_latency`` / ``response_latencies`` (seconds to open, per read).
    A ``TensorDeserializer`` given a stream still at offset 0 reads the URL
    natively, with these options.

    Also upstream's ``response_headers`` (of the response that opened the
    stream, an ``http.client.HTTPMessage``), ``http_response_latencies`` (the
    same list as ``response_latencies``) and ``popen_latencies`` (always empty:
    no curl process is started).
    """

    response_headers = property(lambda self: self.raw.response_headers)
    http_response_latencies = property(lambda self: self.raw.response_latencies)
    popen_latencies = property(lambda self: [])

    def __init__(
        self,
        uri: str,
        begin: Optional[int] = None,
        end: Optional[int] = None,
        headers: Optional[typing.Mapping[str, typing.Any]] = None,
        *,
        buffer_size: Optional[int] = None,
        certificate_handling: Optional[CAInfo] = None,
    ) -> None:
        _require_scheme(uri, ("http", "https"), "CURLStreamFile")
        options = http_options(uri, certificate_handling)
        if headers:
            lines = []
            for name, value in headers.items():
                line = f"{name}: {value}"
                if "\r" in line or "\n" in line or ":" in str(name):
                    raise ValueError(f"Invalid HTTP header {name!r}")
                lines.append(line)
            options["http_headers"] = "\n".join(lines)
        super().__init__(uri, options, begin, end, buffer_size)


class RedisStreamFile(_RemoteReader):
    """
    Upstream's stream over a file stored in Redis by ``to_redis``
    (``redis://host[:port][/db]/prefix``), read through libtensorizer
    (pipelined GETRANGEs on one connection): a buffered, seekable reader from
    `begin` to `end` (exclusive). `buffer_size` sizes the read buffer
    (upstream: the socket's). Counters as ``CURLStreamFile``.
    """

    def __init__(
        self,
        uri: str,
        *,
        begin: Optional[int] = None,
        end: Optional[int] = None,
        buffer_size: Optional[int] = None,
    ) -> None:
        _require_scheme(uri, ("redis",), "RedisStreamFile")
        super().__init__(uri, {}, begin, end, buffer_size)


def _explicit_s3_options(
    uri: str,
    key_id: Optional[str],
    secret: Optional[str],
    endpoint: Optional[str],
    region: Optional[str],
    for_write: bool,
    certificate_handling: Optional[CAInfo] = None,
) -> dict:
    """Options for s3_download / s3_upload, which (as upstream's, on boto3)
    take an endpoint with any scheme, https:// when it has none."""
    _require_scheme(uri, ("s3",), "s3_download" if not for_write else "s3_upload")
    options = http_options(uri, certificate_handling, for_write=for_write)
    options.update(s3_options(key_id, secret, endpoint, None, None, region))
    if endpoint is not None and endpoint.lower().startswith("http://"):
        options["s3_force_http"] = "1"
    return options


def s3_download(
    path_uri: str,
    s3_access_key_id: Optional[str],
    s3_secret_access_key: Optional[str],
    s3_endpoint: Optional[str] = default_s3_read_endpoint,
    s3_region_name: Optional[str] = None,
    s3_signature_version: Optional[str] = None,
    buffer_size: Optional[int] = None,
    begin: Optional[int] = None,
    end: Optional[int] = None,
    certificate_handling: Optional[CAInfo] = None,
) -> CURLStreamFile:
    """
    A buffered, seekable reader of an s3:// object from `begin` to `end`
    (exclusive), as upstream's ``s3_download``. Requests are signed with
    SigV4 headers (upstream presigns a URL; `s3_signature_version` is
    accepted for compatibility, and SigV4 is what S3-compatible services
    accept). Credentials left as None, and an `s3_endpoint` of None, resolve
    as for ``open_stream``.
    """
    options = _explicit_s3_options(
        path_uri, s3_access_key_id, s3_secret_access_key, s3_endpoint,
        s3_region_name, False, certificate_handling,
    )
    return CURLStreamFile._with_options(path_uri, options, begin, end, buffer_size)


def s3_upload(
    path: Union[str, os.PathLike],
    target_uri: str,
    s3_access_key_id: Optional[str],
    s3_secret_access_key: Optional[str],
    s3_endpoint: Optional[str] = default_s3_write_endpoint,
    s3_region_name: Optional[str] = None,
    s3_signature_version: Optional[str] = None,
) -> None:
    """
    Uploads the local file `path` to `target_uri` (s3://bucket/key), as
    upstream's ``s3_upload``: a multipart upload fed straight from the file,
    completed at the end, or aborted (no object) if anything fails.
    Credentials and endpoint as for ``s3_download``.
    """
    options = _explicit_s3_options(
        target_uri, s3_access_key_id, s3_secret_access_key, s3_endpoint,
        s3_region_name, True,
    )
    with open(path, "rb") as src:
        with RemoteWriteStream(target_uri, options) as dst:
            chunk = bytearray(16 << 20)
            with memoryview(chunk) as view:
                while True:
                    n = src.readinto(view)
                    if not n:
                        break
                    dst.write(view[:n])
            if dst.tell() == 0:
                dst._open()  # an empty file still makes an (empty) object


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
    certificate_handling: Optional[CAInfo] = None,
) -> typing.BinaryIO:
    """
    Open a local file path (or ``file://`` URI), or an http(s)://, s3:// or
    redis:// URI, as a binary stream.

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
        force_http, s3_region_name: for s3:// URIs, resolved as upstream
            (FORMAT.md §12.3); s3_signature_version is accepted, and
            requests are signed with SigV4.

    http(s):// and s3:// URIs open read-only as a ``CURLStreamFile``,
    redis:// as a ``RedisStreamFile`` (buffered, seekable; ``buffer_size=0``
    gives the unbuffered ``RemoteStreamFile``); s3:// opens for writing
    ("wb") as a ``RemoteWriteStream`` (a multipart upload, completed on
    ``close()``).

    Returns:
        An open file object.

    Raises:
        ValueError: For a non-binary mode, or writing to http(s):// or
            redis:// (read-only here; use ``to_redis`` to store in Redis).
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
            writing = any(map(normalized_mode.__contains__, "wax+"))
            options = http_options(url, certificate_handling, for_write=is_s3 and writing)
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
            if writing:
                if is_s3:
                    return typing.cast(typing.BinaryIO, RemoteWriteStream(url, options))
                raise ValueError(
                    f"Cannot open {url.split('?')[0].split('@')[-1]!r} for writing:"
                    " http(s) and redis streams are read-only (use to_redis to write Redis)"
                )
            if buffer_size == 0:
                return typing.cast(typing.BinaryIO, RemoteStreamFile(url, options, begin, end))
            cls = RedisStreamFile if url.lower().startswith("redis://") else CURLStreamFile
            return typing.cast(
                typing.BinaryIO,
                cls._with_options(url, options, begin, end, buffer_size or (16 << 20)),
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
