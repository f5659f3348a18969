"""The cffi declarations in tensorizer._native must match <tensorizer.h>:
every function prototype, struct and #define value of the header, so the
binding cannot drift from the C ABI unnoticed."""
import re
from pathlib import Path

from tensorizer import _native

HEADER = Path(__file__).resolve().parents[2] / "tz-capi" / "include" / "tensorizer.h"


def _normalize(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = text.replace("TZ_API ", "")
    text = re.sub(r"\s+", " ", text)
    return re.sub(r"\s*([(){};,*])\s*", r"\1", text).strip()


def _declarations(text: str):
    norm = _normalize(text)
    protos = set(re.findall(r"(?:const )?[a-z_0-9]+ ?\**tz_[a-z_]+\([^)]*\);", norm))
    structs = set(re.findall(r"typedef struct tz_[a-z_]+\{[^}]*\}tz_[a-z_]+;", norm))
    return protos, structs


def test_every_header_declaration_is_in_the_cdef():
    header_protos, header_structs = _declarations(HEADER.read_text())
    cdef_protos, cdef_structs = _declarations(_native.CDEF)
    assert len(header_protos) >= 20 and len(header_structs) >= 6
    assert header_protos - cdef_protos == set()
    assert header_structs - cdef_structs == set()


def test_defines_agree():
    defines = dict(re.findall(r"#define (TZ_[A-Z_0-9]+) (-?(?:0x)?[0-9a-fA-F]+)u?\b", HEADER.read_text()))
    assert "TZ_E_HASH" in defines
    for name, value in defines.items():
        if name.startswith("TZ_VERSION") or name == "TZ_DATA_VERSION_MAX":
            continue
        assert getattr(_native.lib, name) == int(value, 0), name
