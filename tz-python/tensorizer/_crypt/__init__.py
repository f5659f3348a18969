"""
Cryptography support for tensorizer: the exception type, and the
EncryptionParams / DecryptionParams that choose keys (see ``_params``).
"""

__all__ = ["CryptographyError", "EncryptionParams", "DecryptionParams", "available"]

# Upstream's flag for "libsodium could be loaded". libtensorizer always links
# libsodium, so encryption is available wherever this package imports.
available: bool = True


class CryptographyError(Exception):
    """Base class for encryption and decryption failures."""


from ._params import DecryptionParams, EncryptionParams  # noqa: E402
