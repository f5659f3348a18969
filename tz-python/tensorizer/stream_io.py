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

import base64
import configparser
import datetime
import hashlib
import hmac
import http.client
import io
import os
import sys
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

# s3cmd config files consulted, in order, for s3:// credentials that were not
# passed (upstream's name; tests and users patch it, `()` to consult none).
# "~" is expanded at each use, so the home folder of that moment counts.
if sys.platform != "win32":
    _s3_default_config_paths = ("~/.s3cfg",)
else:
    _s3_default_config_paths = ("~\\.s3cfg", "~\\AppData\\Roaming\\s3cmd.ini")

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
    """libtensorizer options for an http(s) or s3 URL: TLS as
    ``_tls_options``; for s3:// the module's current default endpoint for
    reads or writes, and the rest resolved as ``open_stream`` does when given
    no credentials or endpoint."""
    values = {}
    if url.split(":", 1)[0].lower() == "s3":
        values["s3_default_endpoint"] = (
            default_s3_write_endpoint if for_write else default_s3_read_endpoint
        )
        values.update(_s3_open_options(None, None, None, None, None, None))
    values.update(_tls_options(url, certificate_handling))
    return values


def _tls_options(url: str, certificate_handling: Optional[CAInfo] = None) -> dict:
    """TLS options for `url`: `certificate_handling`, or, like the curl tool
    upstream runs, CURL_CA_BUNDLE / SSL_CERT_FILE / SSL_CERT_DIR from the
    environment."""
    if certificate_handling is not None:
        if not isinstance(certificate_handling, CAInfo):
            raise TypeError(
                "certificate_handling: expected CAInfo or None,"
                f" got {certificate_handling.__class__.__name__}"
            )
        return certificate_handling.options()
    values = {}
    if url.split(":", 1)[0].lower() not in ("https", "s3"):
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


class _ParsedCredentials(typing.NamedTuple):
    """What an s3cmd config said (upstream's shape); None where it said nothing."""

    config_file: Optional[str]
    s3_endpoint: Optional[str]
    s3_access_key: Optional[str]
    s3_secret_key: Optional[str]
    use_https: Optional[bool]


_NOTHING_PARSED = _ParsedCredentials(None, None, None, None, None)


def _get_s3cfg_values(config_paths=None) -> _ParsedCredentials:
    """The [default] section of the first readable s3cmd config among
    `config_paths` (a path or a tuple of paths; empty or None:
    ``_s3_default_config_paths`` as it is now). ValueError for a file
    without a [default] section or that does not parse."""
    if not config_paths:
        config_paths = _s3_default_config_paths
    elif isinstance(config_paths, (str, bytes, os.PathLike)):
        config_paths = (config_paths,)
    for candidate in config_paths:
        path = os.path.expanduser(os.fsdecode(candidate))
        # No interpolation: secrets may contain "%".
        config = configparser.ConfigParser(interpolation=None)
        try:
            found = config.read(path)
        except configparser.Error as e:
            raise ValueError(f"Cannot parse the s3cmd config {path}: {e}") from None
        if found:
            break
    else:
        return _NOTHING_PARSED
    if "default" not in config:
        raise ValueError(f"No [default] section in {path}")
    section = config["default"]
    use_https = {"True": True, "False": False}.get(section.get("use_https"))
    return _ParsedCredentials(
        config_file=path,
        s3_endpoint=section.get("host_base"),
        s3_access_key=section.get("access_key"),
        s3_secret_key=section.get("secret_key"),
        use_https=use_https,
    )


def _infer_credentials(
    s3_access_key_id: Optional[str],
    s3_secret_access_key: Optional[str],
    s3_config_path: Optional[Union[str, bytes, os.PathLike]] = None,
) -> _ParsedCredentials:
    """
    Completes an S3 credential pair from an s3cmd config, as upstream's
    helper of the same name: None means "not given" ("" is given: public
    buckets). With both given nothing is read. Otherwise `s3_config_path`
    (or else ``_s3_default_config_paths``) is read, and what it says fills the
    gaps; the result has both keys set, plus the config's endpoint and
    use_https.

    Raises:
        FileNotFoundError: `s3_config_path` was given and does not exist.
        ValueError: no config was found, it does not parse, or it lacks
            a key that was not given.
    """
    if s3_access_key_id is not None and s3_secret_access_key is not None:
        return _ParsedCredentials(None, None, s3_access_key_id, s3_secret_access_key, None)
    if s3_config_path is not None and not os.path.exists(s3_config_path):
        raise FileNotFoundError(f"Explicitly specified s3_config_path does not exist: {s3_config_path}")
    try:
        parsed = _get_s3cfg_values(s3_config_path)
    except ValueError as e:
        raise ValueError(
            "Attempted to access an S3 bucket, but credentials were not provided,"
            " and the fallback .s3cfg file could not be parsed."
        ) from e
    if parsed.config_file is None:
        raise ValueError(
            "Attempted to access an S3 bucket, but credentials were not provided,"
            " and no default .s3cfg file could be found."
        )
    if s3_access_key_id is None:
        s3_access_key_id = parsed.s3_access_key
    if s3_secret_access_key is None:
        s3_secret_access_key = parsed.s3_secret_key
    for value, name in ((s3_access_key_id, "s3_access_key_id"), (s3_secret_access_key, "s3_secret_access_key")):
        if not value:
            raise ValueError(
                f"Attempted to access an S3 bucket, but {name} was not provided,"
                f" and could not be found in the config file at {parsed.config_file}."
            )
    return parsed._replace(s3_access_key=s3_access_key_id, s3_secret_key=s3_secret_access_key)


def _enforce_scheme(endpoint: str, allow_http: bool = False, force_http: bool = False) -> str:
    """`endpoint` with an explicit scheme: https:// unless `force_http`;
    an http:// endpoint only with `allow_http` or `force_http`, else
    ValueError (upstream's rule; tests replace this function to allow
    plain-http servers, and the S3 streams look it up at each call)."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        return ("http://" if force_http else "https://") + endpoint
    scheme = scheme.lower()
    if scheme == "https":
        return "http://" + rest if force_http else endpoint
    if scheme == "http" and (force_http or allow_http):
        return endpoint
    raise ValueError("Non-HTTPS endpoint URLs are not allowed.")


def _s3_open_options(
    access_key_id: Optional[str],
    secret_access_key: Optional[str],
    endpoint: Optional[str],
    config_path: Optional[Union[str, bytes, os.PathLike]],
    force_http: Optional[bool],
    region: Optional[str],
) -> dict:
    """libtensorizer options for opening an s3:// URI the way upstream's
    open_stream does: credentials, endpoint and use_https from the s3cmd
    config here (``_infer_credentials``), the endpoint's scheme decided by
    ``_enforce_scheme``; what is still open (AWS environment variables and
    files, the default endpoint, the region) is resolved natively."""
    try:
        parsed = _infer_credentials(access_key_id, secret_access_key, config_path)
    except (ValueError, FileNotFoundError):
        parsed = None  # as upstream: go on, other sources or anonymous access
    if parsed is not None:
        access_key_id, secret_access_key = parsed.s3_access_key, parsed.s3_secret_key
        endpoint = endpoint or parsed.s3_endpoint
        if force_http is None and parsed.use_https is not None:
            force_http = not parsed.use_https
    # The s3cmd config has been consulted (or deliberately not): "" tells the
    # native side to read none.
    values = s3_options(access_key_id, secret_access_key, None, "", force_http, region)
    if endpoint:
        # A global, so looked up now: a patched _enforce_scheme takes effect.
        endpoint = _enforce_scheme(endpoint, False, bool(force_http))
        values["s3_endpoint"] = endpoint
        # The scheme that came back is the decision, also over force_http.
        scheme = endpoint.partition("://")[0].lower() if "://" in endpoint else None
        if scheme in ("http", "https"):
            values["s3_force_http"] = "1" if scheme == "http" else "0"
    return values


def _s3_config_path_option(config_path) -> str:
    """s3_config_path for callers that leave credentials to the native
    resolution: `config_path`, else the first existing file of
    ``_s3_default_config_paths``, else "" (none: so that patching the
    defaults to ``()`` keeps ~/.s3cfg out)."""
    if config_path is not None:
        return os.fsdecode(os.fspath(config_path))
    for candidate in _s3_default_config_paths:
        path = os.path.expanduser(os.fsdecode(candidate))
        if os.path.isfile(path):
            return path
    return ""


def _parse_s3_uri(uri: str) -> typing.Tuple[str, str]:
    parts = urllib.parse.urlparse(uri)
    if parts.scheme.lower() != "s3":
        raise ValueError(f"Invalid S3 URI: {uri}")
    return parts.netloc, parts.path.lstrip("/")


def _hmac_sha256(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def _presign_v4(
    access_key_id: str,
    secret_access_key: str,
    session_token: Optional[str],
    host: str,
    path: str,
    region: str,
    amz_date: str,
    expires_in: int,
) -> str:
    """The query string of a SigV4 presigned GET of `path` (already
    URI-encoded) on `host` (the Host header, with any port), signed at
    `amz_date` (YYYYMMDDTHHMMSSZ) for `expires_in` seconds."""
    scope = f"{amz_date[:8]}/{region}/s3/aws4_request"
    params = {
        "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
        "X-Amz-Credential": f"{access_key_id}/{scope}",
        "X-Amz-Date": amz_date,
        "X-Amz-Expires": str(int(expires_in)),
        "X-Amz-SignedHeaders": "host",
    }
    if session_token:
        params["X-Amz-Security-Token"] = session_token

    def quote(v: str) -> str:
        return urllib.parse.quote(v, safe="-_.~")

    query = "&".join(f"{quote(k)}={quote(v)}" for k, v in sorted(params.items()))
    canonical = "\n".join(("GET", path, query, f"host:{host}\n", "host", "UNSIGNED-PAYLOAD"))
    to_sign = "\n".join(
        ("AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode("utf-8")).hexdigest())
    )
    key = ("AWS4" + secret_access_key).encode("utf-8")
    for part in (amz_date[:8], region, "s3", "aws4_request"):
        key = _hmac_sha256(key, part)
    signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    return f"{query}&X-Amz-Signature={signature}"


def _presign_v2(access_key_id: str, secret_access_key: str, resource: str, expires: int) -> str:
    """The query string of a signature-version-2 ("s3") presigned GET of
    `resource` ("/bucket/key", URI-encoded), valid until `expires` (epoch)."""
    to_sign = f"GET\n\n\n{int(expires)}\n{resource}"
    digest = hmac.new(secret_access_key.encode("utf-8"), to_sign.encode("utf-8"), hashlib.sha1).digest()
    return urllib.parse.urlencode(
        {"AWSAccessKeyId": access_key_id, "Signature": base64.b64encode(digest).decode(), "Expires": str(int(expires))}
    )


def _s3_download_url(
    path_uri: str,
    s3_access_key_id: Optional[str],
    s3_secret_access_key: Optional[str],
    s3_endpoint: Optional[str] = default_s3_read_endpoint,
    s3_region_name: Optional[str] = None,
    s3_signature_version: Optional[str] = None,
) -> str:
    """
    A URL that GETs the object `path_uri` (s3://bucket/key) from
    `s3_endpoint` with no further credentials, as upstream's helper: with
    both keys "" (or none given and none in AWS_ACCESS_KEY_ID /
    AWS_SECRET_ACCESS_KEY), the plain object URL; otherwise a presigned one,
    signed with `s3_signature_version` ("v4"/"s3v4", or "s3" for version 2;
    default: "s3" for accel-object endpoints, else "v4"). The expiry is
    aligned to a day boundary at least a day away, so that clients presigning
    at about the same time make the same URL (upstream's reason: HTTP caches).
    The endpoint may carry a scheme (https:// when it has none); buckets are
    addressed by path, virtual-hosted for cwobject.com and cwlota.com.
    """
    bucket, key = _parse_s3_uri(path_uri)
    endpoint = s3_endpoint or default_s3_read_endpoint
    scheme, sep, host = endpoint.partition("://")
    if not sep:
        scheme, host = "https", endpoint
    host = host.rstrip("/")
    quoted_key = urllib.parse.quote(key, safe="/~")
    if host.lower() in ("cwobject.com", "cwlota.com"):
        url_host, path = f"{bucket}.{host}", "/" + quoted_key
    else:
        url_host, path = host, f"/{urllib.parse.quote(bucket, safe='')}/{quoted_key}"
    url = f"{scheme.lower()}://{url_host}{path}"

    token = None
    if s3_access_key_id is None and s3_secret_access_key is None:
        s3_access_key_id = os.environ.get("AWS_ACCESS_KEY_ID") or ""
        s3_secret_access_key = os.environ.get("AWS_SECRET_ACCESS_KEY") or ""
        token = os.environ.get("AWS_SESSION_TOKEN") or None
    if not s3_access_key_id and not s3_secret_access_key:
        return url  # unsigned: public buckets
    if not s3_access_key_id or not s3_secret_access_key:
        raise ValueError("Both s3_access_key_id and s3_secret_access_key are needed to sign a URL")

    granularity = 86400
    now = int(time.time())
    expires = now - now % granularity + 2 * granularity
    version = s3_signature_version
    if not version:
        version = "s3" if "accel-object" in host.lower().split(".") else "v4"
    if version == "s3":
        return url + "?" + _presign_v2(
            s3_access_key_id, s3_secret_access_key, f"/{urllib.parse.quote(bucket, safe='')}/{quoted_key}", expires
        )
    if version in ("v4", "s3v4"):
        region = (
            s3_region_name or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        )
        amz_date = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        return url + "?" + _presign_v4(
            s3_access_key_id, s3_secret_access_key, token, url_host, path, region, amz_date, expires - now
        )
    raise ValueError(f"Unsupported s3_signature_version {version!r}: use 'v4', 's3v4' or 's3'")


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

    def read(self, size: Optional[int] = -1) -> bytearray:
        """Up to `size` bytes (all that is left if negative or None), as a
        bytearray, like upstream's RedisStreamFile."""
        if size is None or size < 0:
            size = max(0, self.raw._end - self.tell())
        out = bytearray(size)
        n = self.readinto(out)
        del out[n:]
        return out


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
    options = _tls_options(uri, certificate_handling)
    options["s3_default_endpoint"] = default_s3_write_endpoint if for_write else default_s3_read_endpoint
    options.update(s3_options(key_id, secret, endpoint, _s3_config_path_option(None), None, region))
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
            options = _tls_options(url, certificate_handling)
            if is_s3:
                options["s3_default_endpoint"] = (
                    default_s3_write_endpoint if writing else default_s3_read_endpoint
                )
                options.update(
                    _s3_open_options(
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
