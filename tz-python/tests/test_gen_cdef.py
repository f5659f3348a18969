"""build_backend/gen_cdef.py: the cffi declarations generated from a header."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "build_backend"))
import gen_cdef  # noqa: E402


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_conditionals_includes_and_defines(tmp_path):
    _write(tmp_path, "ver.h", "#define LIB_MAJOR 3\n")
    h = _write(tmp_path, "lib.h", """
#ifndef LIB_H
#define LIB_H
#include <stdint.h>
#include "ver.h"
#if defined(_WIN32)
#  define LIB_API __declspec(dllexport)
#elif defined(__GNUC__)
#  define LIB_API __attribute__((visibility("default")))
#else
#  define LIB_API
#endif
#ifdef __cplusplus
extern "C" {
#endif
/* a comment with int bogus(void); inside */
#define FLAG_A 0x10u   // hex with a suffix
#define ERR_X -7
#define NOT_A_NUMBER "text"
#define INIT { 1 }
typedef struct s { uint32_t version; } s;
TZ_API int f(s *out);
#ifdef __cplusplus
}
#endif
#endif
""")
    cdef = gen_cdef.generate(str(h), [])
    assert "#define LIB_MAJOR 3" in cdef
    assert "#define FLAG_A 0x10\n" in cdef
    assert "#define ERR_X -7" in cdef
    assert "int f(s *out);" in cdef and "TZ_API" not in cdef
    for gone in ("extern", "bogus", "NOT_A_NUMBER", "INIT", "LIB_API", "__declspec"):
        assert gone not in cdef


def test_missing_include_and_unsupported_condition_fail(tmp_path):
    h = _write(tmp_path, "a.h", '#include "nowhere.h"\n')
    with pytest.raises(gen_cdef.HeaderError, match="nowhere.h"):
        gen_cdef.generate(str(h), [])
    h = _write(tmp_path, "b.h", "#if FOO > 2\nint x;\n#endif\n")
    with pytest.raises(gen_cdef.HeaderError, match="only defined"):
        gen_cdef.generate(str(h), [])


def test_a_declaration_cffi_cannot_parse_fails_the_build(tmp_path):
    h = _write(tmp_path, "c.h", "int broken(;\n")
    with pytest.raises(Exception):
        gen_cdef.generate(str(h), [])
    out = tmp_path / "out.py"
    assert gen_cdef.main([str(_write(tmp_path, "d.h", "int ok(void);\n")), "-o", str(out)]) == 0
    ns = {}
    exec(out.read_text(), ns)
    assert ns["CDEF"].strip() == "int ok(void);"
