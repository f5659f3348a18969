"""
Command line: inspect and check a tensorizer file, or add or remove its encryption.

    tensorizer info SRC [KEY] [--json]
    tensorizer verify SRC [KEY] [--threads N] [--json] [--quiet]
    tensorizer encrypt SRC DST (--keyfile F | --new-keyfile F | --password-env VAR | --password-file F) [--quiet]
    tensorizer decrypt SRC DST (--keyfile F | --password-env VAR | --password-file F) [--quiet]
    tensorizer --version | --help

``python -m tensorizer`` is the same command. KEY: --keyfile F |
--password-env VAR | --password-file F, for encrypted files. SRC may be a
path or an http(s)://, s3:// or redis:// URI for info and verify. ``verify``
reads every tensor and checks every stored hash (and, for encrypted files,
every MAC) in bounded memory; it lists each bad tensor.

Key files hold the 32-byte key as 64 hex digits (raw 32-byte files are read
too). Passwords are never taken from the command line, where other users can
see them: they come from an environment variable or a file. Every tensor is
hash-verified on the way; DST appears only once it is complete.

``--json`` prints one JSON document on stdout instead of text (info, verify);
if the command fails, that document is ``{"error": MESSAGE}``. verify,
encrypt and decrypt show a progress bar on stderr when it is a terminal,
unless ``--quiet``.

Exit status (the same with --json):

    0    success (verify: every hash matched)
    1    failure: verify found bad tensors, or the command could not be done
         (missing, unreadable or damaged file, wrong or missing key,
         destination exists); a one-line message on stderr says which
    2    usage error: the command line is wrong
    130  interrupted (Ctrl-C); no partial DST is left behind

Bad tensors and other failures share status 1, as they always have for this
command: scripts that test for non-zero keep working. ``verify --json`` tells
them apart: bad tensors give ``"ok": false`` with a list of failures, other
failures an ``"error"``.
"""

import argparse
import json
import os
import sys
from typing import List, Optional

import tensorizer as _package

from . import _install

_install.check_package_is_ours(_package)

from . import DecryptionParams, EncryptionParams, _crypt  # noqa: E402
from ._progress import Progress  # noqa: E402
from ._rewrite import rewrite  # noqa: E402

PROG = "tensorizer"

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # what argparse exits with
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it

_EXIT_HELP = """\
exit status (the same with --json):
  0    success (verify: every hash matched)
  1    failure: verify found bad tensors, or the command could not be done
       (missing, unreadable or damaged file, wrong or missing key,
       destination exists); a one-line message on stderr says which
  2    usage error: the command line is wrong
  130  interrupted (Ctrl-C); no partial DST is left behind
"""

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


def _version_text() -> "tuple[str, bool]":
    """The --version text, and whether the native library loaded."""
    from . import __version__
    from ._native import native_version

    head = f"{PROG} {__version__} (the upstream tensorizer API it implements)"
    try:
        return f"{head}\nlibtensorizer {native_version()}", True
    except ImportError as e:
        # --version is what one runs to diagnose a broken install: say why.
        return f"{head}\nlibtensorizer: {e}", False


class _VersionAction(argparse.Action):
    # argparse's own "version" action needs the text up front, which would
    # load the native library for every command; this loads it only on use.
    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        text, loaded = _version_text()
        print(text)
        parser.exit(EXIT_OK if loaded else EXIT_FAILURE)


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect or check a tensorizer file, or add or remove its encryption.",
        epilog=_EXIT_HELP + "\nRun 'tensorizer COMMAND --help' for a command's options.",
        formatter_class=fmt,
    )
    p.add_argument("--version", action=_VersionAction, help="print the package and libtensorizer versions")

    # Output options go on each command, after its name, as they are typed.
    quiet = argparse.ArgumentParser(add_help=False)
    quiet.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print one JSON document on stdout")

    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = sub.add_parser(
        "info",
        help="list the file's tensors",
        description="List a file's tensors: type, dtype, shape, bytes and name. Needs no key.",
        epilog=_EXIT_HELP,
        formatter_class=fmt,
        parents=[as_json],
    )
    c.add_argument("src", help="path or http(s)://, s3:// or redis:// URI")
    _key_options(c, required=False)
    c = sub.add_parser(
        "verify",
        help="check every stored hash (exit status 1 if one fails)",
        description="Read every tensor and check every stored hash (and MAC, if encrypted)\n"
        "in bounded memory; list each bad tensor.",
        epilog=_EXIT_HELP,
        formatter_class=fmt,
        parents=[as_json, quiet],
    )
    c.add_argument("src", help="path or http(s)://, s3:// or redis:// URI")
    _key_options(c, required=False)
    c.add_argument("--threads", type=int, default=0, help="reading threads (default: one per CPU)")
    for name, help_text in (
        ("encrypt", "write an encrypted copy of an unencrypted file"),
        ("decrypt", "write an unencrypted copy of an encrypted file"),
    ):
        c = sub.add_parser(
            name,
            help=help_text,
            description=help_text[0].upper() + help_text[1:] + ".\n"
            "Every tensor is hash-verified on the way; DST appears only once complete.",
            epilog=_EXIT_HELP,
            formatter_class=fmt,
            parents=[quiet],
        )
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


def _progress(args, label: str) -> Progress:
    # None: shown exactly when stderr is a terminal.
    return Progress(label, enabled=False if args.quiet else None)


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
    data_bytes = sum(e.nbytes for e in entries)
    if args.json:
        _print_json(
            {
                "src": args.src,
                "data_version": int(info.data_version),
                "encrypted": bool(info.encrypted),
                "tensor_count": len(entries),
                "data_bytes": data_bytes,
                "tensors": [
                    {
                        "name": str(e.name),
                        "path": list(e.path),
                        "type": e.tensor_type.name,
                        "dtype": e.dtype,
                        "shape": list(e.shape),
                        "size": e.nbytes,
                        "meta": bool(e.is_meta),
                    }
                    for e in entries
                ],
            }
        )
        return EXIT_OK
    encrypted = "yes" if info.encrypted else "no"
    print(
        f"{args.src}: data version {info.data_version}, {len(entries)} tensors,"
        f" {data_bytes} bytes of tensor data, encrypted: {encrypted}"
    )
    rows = [
        (e.tensor_type.name, e.dtype + (" (meta)" if e.is_meta else ""), str(list(e.shape)), str(e.nbytes), str(e.name))
        for e in entries
    ]
    titles = ("type", "dtype", "shape", "bytes", "name")
    widths = [max([len(titles[c])] + [len(r[c]) for r in rows]) for c in range(4)]
    for r in [titles] + rows:
        print("  ".join(r[c].ljust(widths[c]) for c in range(4)) + "  " + r[4])
    return EXIT_OK


def _verify(args) -> int:
    from ._verify import verify_file

    decryption = _decryption(args)
    with _progress(args, "verify") as bar:
        report = verify_file(args.src, decryption, max(args.threads, 0), progress=bar.update)
    if args.json:
        names = _tensor_names(args.src, report.bad)
        _print_json(
            {
                "src": args.src,
                "ok": report.ok,
                "tensors": report.tensors,
                "bytes": report.bytes,
                "failed": len(report.failures),
                "failures": [
                    {"index": i, "name": names[i], "reason": message}
                    for i, message in zip(report.bad, report.failures)
                ],
            }
        )
    else:
        for message in report.failures:
            print(f"FAILED: {message}")
        print(
            f"{args.src}: {report.tensors} tensors, {report.bytes} bytes:"
            f" {'all hashes match' if report.ok else f'{len(report.failures)} failed'}"
        )
    return EXIT_OK if report.ok else EXIT_FAILURE


def _tensor_names(src: str, indices: List[int]) -> dict:
    """Names of the tensors at `indices`, read from the index again (only on failure)."""
    if not indices:
        return {}
    from . import _native
    from ._verify import open_native_reader
    from .serialization import _read_entries

    reader = open_native_reader(src, None, metadata_only=True)
    count = _native.ffi.new("uint64_t *")
    _native.check(_native.lib.tz_reader_tensor_count(count, reader))
    entries = _read_entries(reader, int(count[0]))
    return {i: str(entries[i].name) for i in indices}


def _rewrite(args) -> int:
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
            with _progress(args, "encrypt") as bar:
                count = rewrite(args.src, args.dst, encryption=params, overwrite=args.force, progress=bar.update)
        except BaseException:
            if args.new_keyfile:
                os.unlink(args.new_keyfile)  # it encrypts nothing
            raise
    else:
        decryption = _decryption(args)
        with _progress(args, "decrypt") as bar:
            count = rewrite(args.src, args.dst, decryption=decryption, overwrite=args.force, progress=bar.update)
    print(f"{args.command}ed {count} tensors: {args.src} -> {args.dst}")
    return EXIT_OK


def _print_json(document) -> None:
    print(json.dumps(document, indent=2))


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the command line `argv` (default: sys.argv[1:]); returns the exit status."""
    from .serialization import HashMismatchError

    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        # argparse exits on --help, --version and usage errors; an entry
        # point returns its status instead.
        return EXIT_OK if e.code is None else e.code if isinstance(e.code, int) else EXIT_USAGE
    commands = {"info": _info, "verify": _verify, "encrypt": _rewrite, "decrypt": _rewrite}
    try:
        return commands[args.command](args)
    except BrokenPipeError:
        # The reader of stdout went away (e.g. `| head`): nothing to tell it.
        # Point stdout at /dev/null so the interpreter's final flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (
        OSError,
        ValueError,
        _crypt.CryptographyError,
        HashMismatchError,
        RuntimeError,
        MemoryError,
        ImportError,  # the native library could not be loaded
    ) as e:
        message = str(e) or type(e).__name__
        if getattr(args, "json", False):
            _print_json({"error": message})
        print(f"{PROG} {args.command}: error: {message}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
