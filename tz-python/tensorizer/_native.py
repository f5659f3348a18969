"""
Binding to libtensorizer (the C ABI declared in ``tz-capi/include/tensorizer.h``)
through cffi in ABI mode.

``ffi`` is always available. ``lib`` is loaded on first access, so that the
pure-Python parts of the package (``tensorizer.utils``, path helpers, dtype
tables) can be imported and tested without the shared library.

The library is looked up, in order, at:

1. the path in the ``TENSORIZER_LIBRARY`` environment variable,
2. ``libtensorizer.so.0`` next to this file (where a build copies it),
3. ``<repository>/build/tz-capi/libtensorizer.so.0`` (a development checkout).
"""

import os
import re
import threading
from typing import NoReturn, Optional

import cffi

__all__ = ["ffi", "lib", "check", "raise_error", "library_path", "error_message"]

ffi = cffi.FFI()

# Declarations mirror tensorizer.h exactly (minus the TZ_API export macro and
# the TZ_*_INIT initialisers, which cffi cannot parse: set `.version` instead).
CDEF = """
#define TZ_VERSION_MAJOR 0
#define TZ_VERSION_MINOR 1
#define TZ_VERSION_PATCH 0
#define TZ_DATA_VERSION_MAX 5

const char *tz_version(void);

#define TZ_OK 0
#define TZ_E_INVALID_ARG -1
#define TZ_E_IO -2
#define TZ_E_NOT_FOUND -3
#define TZ_E_FORMAT -4
#define TZ_E_VERSION -5
#define TZ_E_TRUNCATED -6
#define TZ_E_HASH -7
#define TZ_E_CONFLICT -8
#define TZ_E_LIMIT -9
#define TZ_E_CRYPTO -10
#define TZ_E_UNSUPPORTED -11
#define TZ_E_STATE -12
#define TZ_E_NOMEM -13
#define TZ_E_INTERNAL -99

const char *tz_error_last(void);
const char *tz_status_name(int status);

typedef struct tz_options tz_options;
int tz_options_new(tz_options **out);
int tz_options_set(tz_options *opts, const char *key, const char *value);
void tz_options_free(tz_options *opts);

typedef struct tz_key tz_key;
#define TZ_KEY_BYTES 32
#define TZ_SALT_BYTES 16
#define TZ_OPSLIMIT_MIN 1
#define TZ_OPSLIMIT_INTERACTIVE 2
#define TZ_OPSLIMIT_MODERATE 3
#define TZ_OPSLIMIT_SENSITIVE 4
#define TZ_OPSLIMIT_MAX 4294967295
#define TZ_MEMLIMIT_MIN 8192
#define TZ_MEMLIMIT_INTERACTIVE 67108864
#define TZ_MEMLIMIT_MODERATE 268435456
#define TZ_MEMLIMIT_SENSITIVE 1073741824
#define TZ_MEMLIMIT_MAX 4398046510080
int tz_key_new_random(tz_key **out);
int tz_key_new_from_bytes(tz_key **out, const void *key, size_t key_len);
int tz_key_new_derived(tz_key **out, const void *password, size_t password_len, uint64_t opslimit,
                       uint64_t memlimit, const uint8_t *salt, size_t salt_len);
int tz_key_new_password(tz_key **out, const void *password, size_t password_len);
int tz_key_get_bytes(uint8_t *out, size_t cap, const tz_key *key);
int tz_key_get_salt(uint8_t *out, size_t cap, const tz_key *key);
void tz_key_free(tz_key *key);
int tz_options_set_key(tz_options *opts, const tz_key *key);

#define TZ_TENSOR_PARAM 0
#define TZ_TENSOR_BUFFER 1
#define TZ_TENSOR_STATE_DICT 2

typedef struct tz_path_component {
  int is_index;
  uint64_t index;
  const char *str;
  size_t str_len;
} tz_path_component;

typedef struct tz_reader tz_reader;

#define TZ_FILE_INFO_VERSION 1

typedef struct tz_file_info {
  uint32_t version;
  uint32_t data_version;
  uint32_t flags;
  uint64_t tensor_count;
  uint64_t tensor_data_size;
  uint64_t metadata_length;
  uint64_t file_size;
  int encrypted;
} tz_file_info;

#define TZ_TENSOR_INFO_VERSION 1

typedef struct tz_tensor_info {
  uint32_t version;
  const uint8_t *name;
  size_t name_len;
  const char *dtype;
  size_t dtype_len;
  uint32_t ndim;
  const uint64_t *shape;
  int32_t tensor_type;
  int32_t module_index;
  uint64_t header_offset;
  uint64_t data_offset;
  uint64_t data_length;
  uint64_t nbytes;
  uint32_t itemsize;
  int is_meta;
  int is_opaque;
  const char *torch_dtype;
  size_t path_len;
  const tz_path_component *path;
} tz_tensor_info;

int tz_reader_open(tz_reader **out, const char *uri, const tz_options *opts);
void tz_reader_free(tz_reader *reader);
int tz_reader_file_info(tz_file_info *out, const tz_reader *reader);
int tz_reader_tensor_count(uint64_t *out, const tz_reader *reader);
int tz_reader_tensor_info(tz_tensor_info *out, tz_reader *reader, uint64_t index);
int tz_reader_load_headers(tz_reader *reader, const uint64_t *indices, size_t count);

#define TZ_READ_VERIFY_HASH 0x1
#define TZ_READ_NO_VERIFY_HASH 0x2

#define TZ_READ_REQUEST_VERSION 1

typedef struct tz_read_request {
  uint32_t version;
  uint64_t index;
  void *dst;
  uint64_t dst_size;
} tz_read_request;

int tz_reader_read(tz_reader *reader, uint64_t index, void *dst, uint64_t dst_size,
                   uint32_t flags);
int tz_reader_read_batch(tz_reader *reader, const tz_read_request *requests, size_t count,
                         uint32_t flags, uint32_t num_threads, size_t *failed);
int tz_reader_verify_bytes(tz_reader *reader, uint64_t index, const void *data,
                           uint64_t size);

typedef struct tz_source tz_source;
int tz_source_open(tz_source **out, const char *uri, const tz_options *opts);
int tz_source_size(uint64_t *out, const tz_source *source);
int tz_source_read(tz_source *source, uint64_t offset, void *dst, size_t len);
int tz_source_response_headers(const char **out, size_t *out_len, const tz_source *source);
void tz_source_free(tz_source *source);

typedef struct tz_sink tz_sink;
int tz_sink_open(tz_sink **out, const char *uri, const tz_options *opts);
int tz_sink_write(tz_sink *sink, uint64_t offset, const void *src, size_t len);
int tz_sink_close(tz_sink *sink);
void tz_sink_free(tz_sink *sink);

typedef struct tz_writer tz_writer;

#define TZ_TENSOR_DESC_VERSION 1

typedef struct tz_tensor_desc {
  uint32_t version;
  const uint8_t *name;
  size_t name_len;
  const char *dtype;
  size_t dtype_len;
  uint32_t ndim;
  const uint64_t *shape;
  uint32_t module_index;
  int32_t tensor_type;
  int is_meta;
  const void *data;
  uint64_t data_size;
} tz_tensor_desc;

int tz_writer_open(tz_writer **out, const char *uri, const tz_options *opts);
int tz_writer_write(tz_writer *writer, const tz_tensor_desc *tensors, size_t count,
                    uint32_t num_threads);

#define TZ_WRITER_STATE_VERSION 1

typedef struct tz_writer_state {
  uint32_t version;
  uint32_t data_version;
  uint64_t tensor_count;
  uint64_t tensor_data_size;
  uint64_t file_size;
} tz_writer_state;

int tz_writer_state_get(tz_writer_state *out, const tz_writer *writer);
int tz_writer_close(tz_writer *writer);
void tz_writer_free(tz_writer *writer);

int tz_path_encode(uint8_t *out, size_t cap, size_t *out_len,
                   const tz_path_component *path, size_t path_len);
"""
ffi.cdef(CDEF)

_LIBRARY_NAME = "libtensorizer.so.0"
_ENV_VAR = "TENSORIZER_LIBRARY"

_load_lock = threading.Lock()
_lib = None
_lib_path: Optional[str] = None


def _candidate_paths():
    env = os.environ.get(_ENV_VAR)
    if env:
        # An explicit setting is authoritative: no fallback to other copies.
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    return [
        os.path.join(here, _LIBRARY_NAME),
        os.path.join(repo, "build", "tz-capi", _LIBRARY_NAME),
    ]


def _load():
    global _lib, _lib_path
    with _load_lock:
        if _lib is not None:
            return _lib
        candidates = _candidate_paths()
        errors = []
        for path in candidates:
            if not os.path.exists(path):
                errors.append(f"{path}: not found")
                continue
            try:
                loaded = ffi.dlopen(path)
            except OSError as e:
                errors.append(f"{path}: {e}")
                continue
            _lib, _lib_path = loaded, path
            globals()["lib"] = loaded
            return loaded
        raise ImportError(
            "tensorizer: could not load the native library "
            f"{_LIBRARY_NAME}. Build it (the tz-capi target), or set"
            f" {_ENV_VAR} to its path. Tried:\n  " + "\n  ".join(errors)
        )


def __getattr__(name):
    # PEP 562: load the shared library lazily, on first access to `lib`.
    if name == "lib":
        return _load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def library_path() -> str:
    """Path of the loaded shared library (loads it if needed)."""
    _load()
    return _lib_path


def native_version() -> str:
    return ffi.string(_load().tz_version()).decode("utf-8", "replace")


def error_message() -> str:
    """The message of the last libtensorizer failure on this thread."""
    raw = _load().tz_error_last()
    if raw == ffi.NULL:
        return ""
    return ffi.string(raw).decode("utf-8", "replace")


_VERSION_RE = re.compile(r"data version (\d+)")


def _exception_for(rc: int, message: str) -> BaseException:
    # Imported here: these modules import this one.
    L = _load()
    if not message:
        message = ffi.string(L.tz_status_name(rc)).decode("ascii", "replace")
    if rc == L.TZ_E_VERSION:
        from .serialization import _FileHeader

        m = _VERSION_RE.search(message)
        version = int(m.group(1)) if m else -1
        return _FileHeader.InvalidVersionError(message, version=version)
    if rc == L.TZ_E_HASH:
        from .serialization import HashMismatchError

        return HashMismatchError(message)
    if rc == L.TZ_E_CRYPTO:
        from . import CryptographyError

        return CryptographyError(message)
    if rc in (
        L.TZ_E_FORMAT,
        L.TZ_E_TRUNCATED,
        L.TZ_E_CONFLICT,
        L.TZ_E_INVALID_ARG,
        L.TZ_E_UNSUPPORTED,
    ):
        return ValueError(message)
    if rc == L.TZ_E_NOT_FOUND:
        return FileNotFoundError(message)
    if rc == L.TZ_E_IO:
        return OSError(message)
    if rc == L.TZ_E_NOMEM:
        return MemoryError(message)
    if rc == L.TZ_E_LIMIT:
        return RuntimeError(message)
    return RuntimeError(message)


def raise_error(rc: int, message: Optional[str] = None) -> NoReturn:
    """Raise the Python exception for the libtensorizer status `rc`."""
    if message is None:
        message = error_message()
    raise _exception_for(rc, message)


def check(rc: int) -> int:
    """Return `rc` if it is TZ_OK (0), else raise the matching exception.

    Must be called on the same thread, right after the failing call, since
    the message comes from thread-local storage in the library.
    """
    if rc != 0:
        raise_error(rc)
    return rc
