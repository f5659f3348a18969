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

__all__ = ["open_stream"]

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


def http_url(path_uri: Union[str, bytes, os.PathLike]) -> Optional[str]:
    """`path_uri` itself if it is an http:// or https:// URL, else None."""
    if isinstance(path_uri, os.PathLike):
        return None
    if isinstance(path_uri, bytes):
        path_uri = os.fsdecode(path_uri)
    scheme, _ = _split_scheme(path_uri)
    return path_uri if scheme in ("http", "https") else None


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
    Open a local file path (or ``file://`` URI) as a binary stream.

    Args:
        path_uri: The path or URI to open. An ``int`` is taken as an open
            file descriptor (which stays owned by the caller).
        mode: A binary mode ("rb", "wb", "wb+", "ab", ...). With "w", "a"
            or "x", missing parent directories are created.
        buffer_size: Buffer size for the file object
            (default ``io.DEFAULT_BUFFER_SIZE``).
        begin: Offset to seek to after opening.
        end: Ignored for local files.
        s3_access_key_id, s3_secret_access_key, s3_endpoint, s3_config_path,
        force_http, s3_region_name, s3_signature_version,
        certificate_handling: Only meaningful for remote schemes, which are
            not supported by this build yet.

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
