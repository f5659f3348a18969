"""
Command line: inspect and check a tensorizer file, or add or remove its encryption.

    python -m tensorizer info SRC [KEY]
    python -m tensorizer verify SRC [KEY] [--threads N]
    python -m tensorizer encrypt SRC DST (--keyfile F | --new-keyfile F | --password-env VAR | --password-file F)
    python -m tensorizer decrypt SRC DST (--keyfile F | --password-env VAR | --password-file F)

KEY: --keyfile F | --password-env VAR | --password-file F, for encrypted
files. SRC may be a path or an http(s)://, s3:// or redis:// URI for info and
verify. ``verify`` reads every tensor and checks every stored hash (and, for
encrypted files, every MAC) in bounded memory; it lists each bad tensor and
exits with status 1 if there is one.

Key files hold the 32-byte key as 64 hex digits (raw 32-byte files are read
too). Passwords are never taken from the command line, where other users can
see them: they come from an environment variable or a file. Every tensor is
hash-verified on the way; DST appears only once it is complete.
"""

import argparse
import os
import sys
from typing import List, Optional

from . import CryptographyError, DecryptionParams, EncryptionParams
from ._rewrite import rewrite

_LIMIT_NAMES = ("min", "interactive", "moderate", "sensitive")


def _read_key(path: str) -> bytes:
    with open(path, "rb") as f:
        raw = f.read(1 << 10)
    if len(raw) == 32:
        return raw
    try:
        key = bytes.fromhex(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != 32:
        raise ValueError(f"{path}: a key file holds 64 hex digits or 32 raw bytes")
    return key


def _write_new_key(path: str, key: bytes) -> None:
    # O_EXCL: never replace an existing key; 0600: the key is a secret.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")


def _password(args) -> Optional[bytes]:
    if args.password_env:
        value = os.environ.get(args.password_env)
        if not value:
            raise ValueError(f"environment variable {args.password_env} is not set or empty")
        return value.encode("utf-8")
    if args.password_file:
        with open(args.password_file, "rb") as f:
            value = f.read().rstrip(b"\r\n")
        if not value:
            raise ValueError(f"{args.password_file} is empty")
        return value
    return None


def _limit(text: str, enum) -> int:
    if text.lower() in _LIMIT_NAMES:
        return enum[text.upper()]
    return int(text)


def _key_options(c: argparse.ArgumentParser, required: bool) -> argparse._MutuallyExclusiveGroup:
    how = c.add_mutually_exclusive_group(required=required)
    how.add_argument("--keyfile", help="file with the 32-byte key (64 hex digits)")
    how.add_argument("--password-env", metavar="VAR", help="read the password from $VAR")
    how.add_argument("--password-file", metavar="FILE", help="read the password from FILE")
    return how


def _decryption(args) -> Optional[DecryptionParams]:
    if args.keyfile:
        return DecryptionParams.from_key(_read_key(args.keyfile))
    password = _password(args)
    return None if password is None else DecryptionParams.from_string(password)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tensorizer",
        description="Inspect or check a tensorizer file, or add or remove its encryption.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("info", help="list the file's tensors")
    c.add_argument("src")
    _key_options(c, required=False)
    c = sub.add_parser("verify", help="check every stored hash (exit status 1 if one fails)")
    c.add_argument("src")
    _key_options(c, required=False)
    c.add_argument("--threads", type=int, default=0, help="reading threads (default: one per CPU)")
    for name, help_text in (
        ("encrypt", "write an encrypted copy of an unencrypted file"),
        ("decrypt", "write an unencrypted copy of an encrypted file"),
    ):
        c = sub.add_parser(name, help=help_text)
        c.add_argument("src")
        c.add_argument("dst")
        how = _key_options(c, required=True)
        if name == "encrypt":
            how.add_argument(
                "--new-keyfile",
                metavar="FILE",
                help="encrypt with a new random key and save it to FILE (created, mode 0600)",
            )
            c.add_argument("--opslimit", default="moderate", help="Argon2id CPU cost for passwords")
            c.add_argument("--memlimit", default="moderate", help="Argon2id memory cost for passwords")
        c.add_argument("--force", action="store_true", help="replace DST if it exists")
    return p


def _info(args) -> int:
    from . import _native
    from ._verify import open_native_reader
    from .serialization import _read_entries

    # Tensor headers are stored in the clear: listing needs no key.
    reader = open_native_reader(args.src, _decryption(args), metadata_only=True)
    lib, ffi = _native.lib, _native.ffi
    info = ffi.new("tz_file_info *", {"version": lib.TZ_FILE_INFO_VERSION})
    _native.check(lib.tz_reader_file_info(info, reader))
    count = ffi.new("uint64_t *")
    _native.check(lib.tz_reader_tensor_count(count, reader))
    entries = _read_entries(reader, int(count[0]))
    encrypted = "yes" if info.encrypted else "no"
    print(
        f"{args.src}: data version {info.data_version}, {len(entries)} tensors,"
        f" {sum(e.nbytes for e in entries)} bytes of tensor data, encrypted: {encrypted}"
    )
    rows = [
        (e.tensor_type.name, e.dtype + (" (meta)" if e.is_meta else ""), str(list(e.shape)), str(e.nbytes), str(e.name))
        for e in entries
    ]
    titles = ("type", "dtype", "shape", "bytes", "name")
    widths = [max([len(titles[c])] + [len(r[c]) for r in rows]) for c in range(4)]
    for r in [titles] + rows:
        print("  ".join(r[c].ljust(widths[c]) for c in range(4)) + "  " + r[4])
    return 0


def _verify(args) -> int:
    from ._verify import verify_file

    report = verify_file(args.src, _decryption(args), max(args.threads, 0))
    for message in report.failures:
        print(f"FAILED: {message}")
    print(
        f"{args.src}: {report.tensors} tensors, {report.bytes} bytes:"
        f" {'all hashes match' if report.ok else f'{len(report.failures)} failed'}"
    )
    return 0 if report.ok else 1


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "info":
            return _info(args)
        if args.command == "verify":
            return _verify(args)
        password = _password(args)
        if args.command == "encrypt":
            if args.new_keyfile:
                params = EncryptionParams.random()
                _write_new_key(args.new_keyfile, params.key)
            elif args.keyfile:
                params = EncryptionParams(_read_key(args.keyfile))
            else:
                params = EncryptionParams.from_string(
                    password,
                    _limit(args.opslimit, EncryptionParams.OpsLimit),
                    _limit(args.memlimit, EncryptionParams.MemLimit),
                )
            try:
                count = rewrite(args.src, args.dst, encryption=params, overwrite=args.force)
            except BaseException:
                if args.new_keyfile:
                    os.unlink(args.new_keyfile)  # it encrypts nothing
                raise
        else:
            count = rewrite(args.src, args.dst, decryption=_decryption(args), overwrite=args.force)
    except (OSError, ValueError, CryptographyError, RuntimeError) as e:
        print(f"python -m tensorizer {args.command}: error: {e}", file=sys.stderr)
        return 1
    print(f"{args.command}ed {count} tensors: {args.src} -> {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
