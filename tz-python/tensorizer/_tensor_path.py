"""
Tensor paths (FORMAT.md §4.3).

A tensor path is a non-empty tuple of components, each a ``str`` (mapping key)
or a non-negative ``int`` (sequence index). A path that is exactly one ``str``
is stored as that string's raw UTF-8 bytes; every other path is stored as the
byte 0x1E followed by a compact ASCII JSON array.

Decoding stored names is done by the native library; this module encodes,
normalizes, flattens nested state dicts into paths, and rebuilds nested
structures from paths.
"""

import json
import operator
import types
import typing
from typing import Any, Dict, Iterable, Iterator, List, Tuple, Union

__all__ = [
    "TensorPathComponent",
    "RECORD_SEPARATOR",
    "validate_path",
    "to_path",
    "normalize",
    "is_str_path",
    "encode_path",
    "flatten_structure",
    "build_structure",
    "filter_structure",
    "restructure",
]

TensorPathComponent = Union[str, int]
TensorPath = Tuple[TensorPathComponent, ...]

RECORD_SEPARATOR = b"\x1e"


def validate_path(path: TensorPath) -> None:
    """Raise if `path` is not a valid tensor path."""
    if not path:
        raise ValueError("Invalid empty tensor path")
    for c in path:
        if not isinstance(c, (str, int)):
            raise TypeError(
                f"Invalid tensor path component type: {c.__class__.__name__!r}"
            )
        if isinstance(c, int) and c < 0:
            raise ValueError(
                f"Invalid negative integer tensor path component: {c}"
            )


def to_path(value: Union[str, int, tuple, list]) -> TensorPath:
    """Wrap a name (str) or a sequence of components as a path tuple."""
    if isinstance(value, tuple):
        return value
    if isinstance(value, list):
        return tuple(value)
    return (value,)


def is_str_path(path: TensorPath) -> bool:
    return len(path) == 1 and isinstance(path[0], str)


def normalize(path: TensorPath) -> Union[str, tuple]:
    """The user-facing form of a path: a plain ``str`` or a ``tuple``."""
    if len(path) == 1 and isinstance(path[0], str):
        return path[0]
    return tuple(path)


def encode_path(path: Union[str, TensorPath]) -> bytes:
    """The stored form of a tensor name (FORMAT.md §4.3)."""
    if isinstance(path, str):
        return path.encode("utf-8")
    if len(path) == 1 and isinstance(path[0], str):
        return path[0].encode("utf-8")
    # bool is an int subclass; json would write true/false, so coerce
    components = [
        c if isinstance(c, str) or type(c) is int else operator.index(c)
        for c in path
    ]
    return RECORD_SEPARATOR + json.dumps(
        components, indent=None, ensure_ascii=True, separators=(",", ":")
    ).encode("ascii")


def _key_value_iterator(obj) -> Iterator[Tuple[TensorPathComponent, Any]]:
    if isinstance(obj, typing.Mapping):
        for k in obj.keys():
            if not isinstance(k, str):
                raise TypeError(
                    "Invalid key type for state_dict: expected str, got"
                    f" {k.__class__.__name__!r}"
                )
        return iter(obj.items())
    # str/bytes are sequences, but never containers of tensors
    elif isinstance(obj, typing.Sequence) and not isinstance(
        obj, (str, bytes, bytearray, memoryview)
    ):
        return enumerate(obj)
    else:
        raise TypeError(
            "Cannot serialize type as part of a state_dict:"
            f" {obj.__class__.__name__!r}"
        )


def flatten_structure(
    leaf_type: type, obj: Any, prefix: TensorPath = ()
) -> Iterator[Tuple[TensorPath, Any]]:
    """
    Depth-first walk of nested mappings and sequences, yielding
    ``(path, leaf)`` for every instance of `leaf_type`.
    """
    stack: List[Tuple[TensorPath, Iterator]] = [
        (prefix, _key_value_iterator(obj))
    ]
    while stack:
        pre, it = stack[-1]
        for key, item in it:
            path = pre + (key,)
            if isinstance(item, leaf_type):
                yield path, item
            else:
                stack.append((path, _key_value_iterator(item)))
                break
        else:
            stack.pop()


def build_structure(paths: Iterable[TensorPath]) -> dict:
    """
    Build a prefix tree of nested dicts whose leaves are the paths
    themselves, in order of first appearance. Assumes conflict-free paths.
    """
    root: dict = {}
    for path in paths:
        branch = root
        for c in path[:-1]:
            nxt = branch.get(c)
            if nxt is None:
                nxt = branch[c] = {}
            elif not isinstance(nxt, dict):
                raise ValueError(
                    f"Conflicting tensor paths: {normalize(path)} has a prefix"
                    " that is also a tensor"
                )
            branch = nxt
        if path[-1] in branch:
            raise ValueError(
                f"Conflicting tensor paths: {normalize(path)} is used"
                " multiple times or is both a leaf and a prefix"
            )
        branch[path[-1]] = path
    return root


def filter_structure(structure: dict, keep) -> dict:
    """Copy of a prefix tree holding only the leaves for which keep(path)."""
    out = {}
    for k, v in structure.items():
        if isinstance(v, dict):
            sub = filter_structure(v, keep)
            if sub:
                out[k] = sub
        elif keep(v):
            out[k] = v
    return out


def restructure(
    flat: Dict[TensorPath, Any], use_dict_proxies: bool = False
) -> Union[dict, list, types.MappingProxyType]:
    """
    Rebuild a nested structure from ``{path: leaf}``.

    With `use_dict_proxies`, every level is a read-only ``MappingProxyType``
    (list levels get ``int`` keys). Otherwise levels whose keys are ints
    become lists ordered by index (gaps collapse), others dicts.
    """
    base: dict = {}
    for path, leaf in flat.items():
        if len(path) < 1:
            raise ValueError("Invalid empty tensor path key")
        branch = base
        for c in path[:-1]:
            branch = branch.setdefault(c, {})
            if not isinstance(branch, dict):
                raise RuntimeError(f"Key path conflict for key {path}")
        if path[-1] in branch:
            raise RuntimeError(f"Key path conflict for key {path}")
        branch[path[-1]] = leaf

    def retype(layer: dict):
        if use_dict_proxies:
            return types.MappingProxyType(layer)
        is_list = False
        for key in layer:
            if isinstance(key, int):
                is_list = True
                if key < 0:
                    raise ValueError(
                        "Illegal negative integer tensor path component"
                    )
            elif is_list:
                raise ValueError(
                    "Invalid tensor path keys: mixes dict and list on same layer"
                )
        if is_list:
            return [v for _, v in sorted(layer.items(), key=operator.itemgetter(0))]
        return layer

    # Nesting depth is bounded by the path lengths; recursion is fine for any
    # realistic depth, but use an explicit stack to be safe for deep paths.
    stack = [(None, None, base, iter(tuple(base)))]
    result = base
    while stack:
        parent, parent_key, layer, keys = stack[-1]
        for k in keys:
            v = layer[k]
            if isinstance(v, dict):
                stack.append((layer, k, v, iter(tuple(v))))
                break
        else:
            typed = retype(layer)
            if parent is None:
                result = typed
            else:
                parent[parent_key] = typed
            stack.pop()
    return result
