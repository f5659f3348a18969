"""
EncryptionParams and DecryptionParams: upstream tensorizer's API for
choosing keys, backed by libtensorizer's key handles (libsodium underneath).

The secret itself is held twice: in the ``key`` / ``source`` attributes that
upstream's API exposes (Python bytes, which cannot be wiped), and in a native
``tz_key`` in guarded, wiped-on-free memory that readers and writers use.
Neither ``repr()`` nor any error message shows either.
"""

from enum import IntEnum
from typing import Optional, Union

from .. import _native
from .._native import ffi

__all__ = ["EncryptionParams", "DecryptionParams"]

_BytesLike = (bytes, bytearray, memoryview)


class _NativeKey:
    """Owns one tz_key handle (freed, and its memory wiped, on collection)."""

    __slots__ = ("ptr",)

    def __init__(self, make):
        out = ffi.new("tz_key **")
        _native.check(make(out))
        self.ptr = ffi.gc(out[0], _native.lib.tz_key_free)

    @classmethod
    def from_bytes(cls, key: bytes) -> "_NativeKey":
        return cls(lambda out: _native.lib.tz_key_new_from_bytes(out, key, len(key)))

    @classmethod
    def random(cls) -> "_NativeKey":
        return cls(_native.lib.tz_key_new_random)

    @classmethod
    def derived(
        cls, source: bytes, opslimit: int, memlimit: int, salt: Optional[bytes]
    ) -> "_NativeKey":
        # A NULL salt asks the library for a random one.
        salt_arg = ffi.NULL if salt is None else salt
        salt_len = 0 if salt is None else len(salt)
        return cls(
            lambda out: _native.lib.tz_key_new_derived(
                out, source, len(source), opslimit, memlimit, salt_arg, salt_len
            )
        )

    @classmethod
    def password(cls, source: bytes) -> "_NativeKey":
        return cls(lambda out: _native.lib.tz_key_new_password(out, source, len(source)))

    def key_bytes(self) -> bytes:
        buf = ffi.new("uint8_t[]", _native.lib.TZ_KEY_BYTES)
        _native.check(_native.lib.tz_key_get_bytes(buf, len(buf), self.ptr))
        return bytes(ffi.buffer(buf))

    def salt(self) -> bytes:
        buf = ffi.new("uint8_t[]", _native.lib.TZ_SALT_BYTES)
        _native.check(_native.lib.tz_key_get_salt(buf, len(buf), self.ptr))
        return bytes(ffi.buffer(buf))


def _check_limit(value: int, lower: int, upper: int, name: str) -> None:
    if not lower <= value <= upper:
        raise ValueError(f"Invalid {name}, must be in the range [{lower}, {upper}]")


class EncryptionParams:
    """
    Encryption parameters for a ``TensorSerializer``.

    * ``EncryptionParams.random()``: a random 32-byte key (fastest; keep
      ``.key`` to decrypt later with ``DecryptionParams.from_key``).
    * ``EncryptionParams.from_string(source, ...)``: a key derived from a
      password with Argon2id; the cost parameters and the salt are stored in
      the file, so ``DecryptionParams.from_string(source)`` decrypts it.
    * ``EncryptionParams(key)``: an exact 32-byte key of your own.
    """

    __slots__ = ("key", "_salt", "_native")

    class OpsLimit(IntEnum):
        """Argon2id CPU cost presets (libsodium's): MIN < INTERACTIVE < MODERATE < SENSITIVE."""

        MIN = 1
        INTERACTIVE = 2
        MODERATE = 3
        SENSITIVE = 4

    class MemLimit(IntEnum):
        """Argon2id memory cost presets in bytes (libsodium's)."""

        MIN = 8192
        INTERACTIVE = 67108864
        MODERATE = 268435456
        SENSITIVE = 1073741824

    key: bytes

    def __init__(self, key: bytes):
        if not isinstance(key, _BytesLike):
            raise TypeError(
                "Encryption key must be a cryptographically secure bytestring."
                " To derive an encryption key from an arbitrary string,"
                " use EncryptionParams.from_string()"
            )
        if len(key) != _native.lib.TZ_KEY_BYTES:
            raise ValueError(
                "Invalid encryption key length, should be"
                f" {_native.lib.TZ_KEY_BYTES} bytes; got {len(key)} bytes instead."
                " To generate a valid encryption key from any string or bytes"
                " object, use EncryptionParams.from_string()"
            )
        self.key = bytes(key)
        self._salt: Optional[bytes] = None
        self._native: Optional[_NativeKey] = None

    @classmethod
    def random(cls) -> "EncryptionParams":
        """A new random 32-byte key. Save ``.key`` to decrypt later."""
        handle = _NativeKey.random()
        params = cls(handle.key_bytes())
        params._native = handle
        return params

    @classmethod
    def from_string(
        cls,
        source: Union[str, bytes],
        opslimit: Union["EncryptionParams.OpsLimit", int, None] = None,
        memlimit: Union["EncryptionParams.MemLimit", int, None] = None,
        salt: Union[str, bytes, None] = None,
        *,
        encoding="utf-8",
    ) -> "EncryptionParams":
        """
        Derives a key from ``source`` with Argon2id (RFC 9106).

        ``opslimit`` and ``memlimit`` set its CPU and memory cost (defaults:
        ``OpsLimit.MODERATE``, ``MemLimit.MODERATE``, about 0.5 s and
        256 MiB). ``salt`` is 16 bytes, random when None; it is stored in the
        file, so it need not be kept.
        """
        if not source:
            raise ValueError("Source cannot be empty")
        if isinstance(opslimit, cls.MemLimit) or not isinstance(
            opslimit, (cls.OpsLimit, int, type(None))
        ):
            raise TypeError(
                "opslimit parameter: expected EncryptionParams.OpsLimit,"
                f" int, or None; {opslimit.__class__.__name__} found"
            )
        if isinstance(memlimit, cls.OpsLimit) or not isinstance(
            memlimit, (cls.MemLimit, int, type(None))
        ):
            raise TypeError(
                "memlimit parameter: expected EncryptionParams.MemLimit,"
                f" int, or None; {memlimit.__class__.__name__} found"
            )
        if isinstance(source, str):
            source = source.encode(encoding)
        elif not isinstance(source, _BytesLike):
            raise TypeError("Invalid source type: must be str or bytes")
        source = bytes(source)
        opslimit = int(cls.OpsLimit.MODERATE if opslimit is None else opslimit)
        memlimit = int(cls.MemLimit.MODERATE if memlimit is None else memlimit)
        lib = _native.lib
        if salt is None:
            salt_bytes = None
        elif isinstance(salt, _BytesLike):
            salt_bytes = bytes(salt)
            if len(salt_bytes) != lib.TZ_SALT_BYTES:
                raise ValueError(
                    f"Invalid salt size, {len(salt_bytes)} != {lib.TZ_SALT_BYTES}"
                )
        else:
            # Upstream declares str salts but rejects them; so do we.
            raise TypeError(
                "Invalid type for salt, expected bytes, bytearray, or memoryview;"
                f" got {type(salt).__name__}"
            )
        _check_limit(opslimit, lib.TZ_OPSLIMIT_MIN, lib.TZ_OPSLIMIT_MAX, "opslimit")
        _check_limit(memlimit, lib.TZ_MEMLIMIT_MIN, lib.TZ_MEMLIMIT_MAX, "memlimit")
        handle = _NativeKey.derived(source, opslimit, memlimit, salt_bytes)
        params = cls(handle.key_bytes())
        params._salt = handle.salt()
        params._native = handle
        return params

    @property
    def salt(self) -> bytes:
        """The 16-byte salt of a key made by ``from_string``."""
        if self._salt is None:
            raise ValueError(
                "An exact binary key is being used."
                " Exact binary keys do not use key derivation algorithms,"
                " and thus have no salt."
            )
        return self._salt

    def _native_key(self) -> _NativeKey:
        """The native handle writers take (made on first use for exact keys)."""
        if self._native is None or self._native.key_bytes() != self.key:
            if self._salt is not None:
                raise ValueError(
                    "EncryptionParams.key was changed after from_string();"
                    " make new parameters instead"
                )
            self._native = _NativeKey.from_bytes(self.key)
        return self._native

    def __repr__(self) -> str:
        kind = "from_string" if self._salt is not None else "key"
        return f"<EncryptionParams ({kind}; key hidden)>"


class DecryptionParams:
    """
    Decryption parameters for a ``TensorDeserializer``.

    * ``DecryptionParams.from_key(key)``: the exact 32-byte key (e.g. the
      ``.key`` of the ``EncryptionParams`` used to write). Always works and is
      the fastest.
    * ``DecryptionParams.from_string(source)``: the password given to
      ``EncryptionParams.from_string``; the key is derived again with the
      parameters stored in the file.
    """

    __slots__ = ("key", "source")

    key: Optional[bytes]
    source: Optional[bytes]

    def __init__(self):
        self.key = None
        self.source = None

    @classmethod
    def from_string(cls, source: Union[str, bytes], *, encoding="utf-8") -> "DecryptionParams":
        if not source:
            raise ValueError("Source cannot be empty")
        if isinstance(source, str):
            source = source.encode(encoding)
        elif not isinstance(source, bytes):
            raise TypeError("Invalid source type: must be str or bytes")
        params = cls()
        params.source = source
        return params

    @classmethod
    def from_key(cls, key: bytes) -> "DecryptionParams":
        if not key:
            raise ValueError("Key cannot be empty")
        if len(key) != _native.lib.TZ_KEY_BYTES:
            raise ValueError(
                "Invalid decryption key length, should be"
                f" {_native.lib.TZ_KEY_BYTES} bytes; got {len(key)} bytes instead."
                " DecryptionParams.from_key() should be used with a key"
                " read from EncryptionParams.key."
                " To decrypt with an arbitrary string instead of a binary key,"
                " use DecryptionParams.from_string() instead."
            )
        params = cls()
        params.key = key
        return params

    def _native_key(self) -> _NativeKey:
        if self.key is not None:
            return _NativeKey.from_bytes(bytes(self.key))
        if self.source is not None:
            return _NativeKey.password(bytes(self.source))
        raise ValueError("Invalid DecryptionParams, no key or source string provided")

    def __eq__(self, other):
        if not isinstance(other, DecryptionParams):
            return NotImplemented
        return (self.key, self.source) == (other.key, other.source)

    __hash__ = None

    def __repr__(self) -> str:
        # Upstream's dataclass repr prints the secret; ours never does.
        key = "<hidden>" if self.key is not None else "None"
        source = "<hidden>" if self.source is not None else "None"
        return f"DecryptionParams(key={key}, source={source})"
