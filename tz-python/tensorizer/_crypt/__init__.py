"""
Cryptography support for tensorizer.

Only the exception type lives here for now; encryption and decryption
(EncryptionParams / DecryptionParams) come in a later change.
"""

__all__ = ["CryptographyError"]


class CryptographyError(Exception):
    """Base class for encryption and decryption failures."""
