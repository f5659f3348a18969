#!/usr/bin/env python3
"""
Generates the cffi declarations of the Python package from <tensorizer.h>.

The header is the one description of the C ABI; the package's
``tensorizer/_cdef.py`` is derived from it at build time (by the wheel's CMake
build, the Makefile's development build, or a distro build), so the Python
binding cannot drift from the library it loads.

The header is written to be readable by cffi after light preprocessing:
quoted ``#include``s are inlined, conditionals are evaluated with no macro
defined (which drops ``extern "C"`` and the export-macro variants), comments
and the ``TZ_API`` marker are removed, and of the ``#define``s only integer
constants are kept (cffi accepts ``#define NAME <integer>``). The result is
parsed with cffi before it is written, so a header cffi cannot read fails the
build instead of the import.

    gen_cdef.py tensorizer.h -I <dir with tensorizer_version.h> -o _cdef.py
"""

import argparse
import os
import re
import sys

_DIRECTIVE = re.compile(r"^\s*#\s*(\w+)\s*(.*)$")
_INT_DEFINE = re.compile(r"^(\w+)\s+(-?(?:0[xX][0-9a-fA-F]+|\d+))[uUlL]*$")
_DEFINED = re.compile(r"^(?:defined\s*\(\s*(\w+)\s*\)|defined\s+(\w+))$")
_EXPORT_MARKER = "TZ_API"


class HeaderError(Exception):
    pass


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _find_include(name: str, including_dir: str, include_dirs):
    for d in [including_dir, *include_dirs]:
        candidate = os.path.join(d, name)
        if os.path.isfile(candidate):
            return candidate
    raise HeaderError(f'#include "{name}": not found in {[including_dir, *include_dirs]}')


def _condition(kind: str, arg: str, defined: set) -> bool:
    if kind == "ifdef":
        return arg.strip() in defined
    if kind == "ifndef":
        return arg.strip() not in defined
    m = _DEFINED.match(arg.strip())
    if not m:
        raise HeaderError(f"#{kind} {arg}: only defined(NAME) conditions are supported")
    return (m.group(1) or m.group(2)) in defined


def preprocess(path: str, include_dirs, defined=None, seen=None) -> list:
    """Declaration lines of `path` and the quoted headers it includes."""
    defined = set() if defined is None else defined
    seen = set() if seen is None else seen
    real = os.path.realpath(path)
    if real in seen:
        return []
    seen.add(real)
    with open(path, encoding="utf-8") as f:
        text = _strip_comments(f.read())
    # A stack of (this branch is active, some branch of this #if was taken).
    stack = []
    out = []
    for line in text.splitlines():
        active = all(a for a, _ in stack)
        m = _DIRECTIVE.match(line)
        if not m:
            if active and line.strip():
                out.append(line.replace(_EXPORT_MARKER + " ", "").rstrip())
            continue
        kind, arg = m.group(1), m.group(2).strip()
        if kind in ("if", "ifdef", "ifndef"):
            taken = _condition(kind, arg, defined) if active else False
            stack.append((taken, taken))
        elif kind == "elif":
            _, was_taken = stack.pop()
            taken = not was_taken and _condition("if", arg, defined)
            stack.append((taken, was_taken or taken))
        elif kind == "else":
            _, was_taken = stack.pop()
            stack.append((not was_taken, True))
        elif kind == "endif":
            stack.pop()
        elif not active:
            continue
        elif kind == "define":
            name = arg.split(None, 1)[0] if arg else ""
            defined.add(name.split("(", 1)[0])
            const = _INT_DEFINE.match(arg)
            if const:
                out.append(f"#define {const.group(1)} {const.group(2)}")
        elif kind == "include":
            if arg.startswith('"'):
                name = arg.strip('"')
                inc = _find_include(name, os.path.dirname(path), include_dirs)
                out.extend(preprocess(inc, include_dirs, defined, seen))
            # <system> headers: cffi knows the standard integer types.
        else:
            raise HeaderError(f"{path}: unsupported directive #{kind}")
    if stack:
        raise HeaderError(f"{path}: unterminated #if")
    return out


def generate(header: str, include_dirs) -> str:
    cdef = "\n".join(preprocess(header, include_dirs)) + "\n"
    if _EXPORT_MARKER in cdef:
        raise HeaderError(f"{_EXPORT_MARKER} left in the declarations")
    import cffi  # only to validate; the declarations are data

    cffi.FFI().cdef(cdef)
    return cdef


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    ap.add_argument("header")
    ap.add_argument("-I", dest="include_dirs", action="append", default=[])
    ap.add_argument("-o", dest="output", required=True)
    args = ap.parse_args(argv)
    try:
        cdef = generate(args.header, args.include_dirs)
    except (HeaderError, OSError) as e:
        print(f"gen_cdef: {e}", file=sys.stderr)
        return 1
    body = (
        '"""cffi declarations of libtensorizer, generated from tensorizer.h at build\n'
        'time by build_backend/gen_cdef.py. Do not edit: rebuild instead."""\n\n'
        f"CDEF = {cdef!r}\n"
    )
    tmp = args.output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(body)
    os.replace(tmp, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
