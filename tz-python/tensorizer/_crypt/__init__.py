"""
Cryptography support for tensorizer: the exception type, and the
EncryptionParams / DecryptionParams that choose keys (see ``_params``).
"""

__all__ = ["CryptographyError", "EncryptionParams", "DecryptionParams"]


class CryptographyError(Exception):
    """Base class for encryption and decryption failures."""


from ._params import DecryptionParams, EncryptionParams  # noqa: E402
