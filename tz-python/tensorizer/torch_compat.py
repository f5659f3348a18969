"""
``torch.save`` / ``torch.load`` with tensorizer as the storage backend.

Inside :func:`tensorizer_saving`, ``torch.save(obj, f)`` writes the pickled
structure of ``obj`` to ``f`` as usual, but every tensor storage goes to a
tensorizer "sidecar" file (by default ``f + ".tensors"``) instead of into
``f``. Inside :func:`tensorizer_loading`, ``torch.load(f)`` reads them back
from the sidecar::

    from tensorizer.torch_compat import tensorizer_saving, tensorizer_loading

    with tensorizer_saving():
        torch.save(model, "model.pt")          # model.pt + model.pt.tensors
    with tensorizer_loading(device="cpu", num_readers=4):
        model = torch.load("model.pt", weights_only=False)

Files are interchangeable with upstream tensorizer's ``torch_compat``: each
storage is pickled as the persistent id
``("TensorizerPickler", 0, "storage", index, dtype)`` (``dtype`` is None for
an ``UntypedStorage``), and the sidecar is an ordinary tensorizer file written
by ``TensorSerializer.write_state_dict`` from a list of 1-D ``uint8`` tensors,
one per distinct storage, each covering the whole storage. So storages shared
between tensors (tied weights, views) are stored once and come back shared.

Only ``torch.save`` / ``torch.load`` calls made in the context (thread or
async task) that entered the manager are affected; others see plain torch.

Beyond upstream:

* ``torch.load(map_location=...)`` places the sidecar's storages: a ``str``
  or ``torch.device`` (including ``"meta"``, which reads no tensor data),
  a ``dict`` of location tags, or a callable ``(storage, location) ->
  storage | None``, as ``torch.load`` does. The sidecar does not record where
  a storage lived when it was saved, so the location tag a ``dict`` or
  callable sees is the one the load would use without ``map_location``: the
  ``device=`` given to :func:`tensorizer_loading`, else ``cuda:N`` if CUDA is
  available, else ``"cpu"``. A ``map_location`` overrides ``device=``.
* ``torch.load(weights_only=True)`` is refused with an explaining
  ``RuntimeError`` (torch cannot restrict unpickling with a custom pickle
  module) unless ``suppress_weights_only=True``; leaving ``weights_only``
  unset loads normally, as with upstream.
* ``dtype=`` and ``filter_func=`` for the deserializer are refused (without a
  ``load_func``): they would cast or drop raw storage bytes and silently
  corrupt the result.
* A ``torch.save`` target with no usable name (``io.BytesIO``, or a file
  object without a path name) logs a warning and falls back to plain torch,
  like upstream does for ``io.BytesIO``; upstream raises ``TypeError`` for
  other nameless file objects.
"""

import contextlib
import dataclasses
import functools
import inspect
import io
import logging
import os
import pickle
import threading
import types
from contextvars import ContextVar
from typing import IO, Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch

from .serialization import TensorDeserializer, TensorSerializer

__all__ = ["tensorizer_saving", "tensorizer_loading"]

logger = logging.getLogger(__name__)

# What torch.save / torch.load take as `f`; file_obj callbacks receive it.
# Upstream's name, which user callbacks may use in their annotations.
_FileLike = Union[str, os.PathLike, IO[bytes]]

# The persistent id's tag and version (shared with upstream's files).
_PID_TAG = "TensorizerPickler"
_PID_VERSION = 0


# -- configuration carried by ContextVars ---------------------------------------


@dataclasses.dataclass(frozen=True)
class _SaveConfig:
    file_obj: Any
    save_func: Optional[Callable]
    kwargs: Dict[str, Any]


@dataclasses.dataclass(frozen=True)
class _LoadConfig:
    file_obj: Any
    load_func: Optional[Callable]
    suppress_weights_only: bool
    kwargs: Dict[str, Any]


# The innermost active context of each kind in this thread / task.
_save_config: ContextVar[Optional[_SaveConfig]] = ContextVar(
    "tensorizer_torch_compat_save", default=None
)
_load_config: ContextVar[Optional[_LoadConfig]] = ContextVar(
    "tensorizer_torch_compat_load", default=None
)
# Set only while one wrapped torch.save / torch.load call runs, because torch
# builds the pickler itself and only the pickle module class is ours.
_save_call: ContextVar[Optional["_SaveCall"]] = ContextVar(
    "tensorizer_torch_compat_save_call", default=None
)
_load_call: ContextVar[Optional["_LoadCall"]] = ContextVar(
    "tensorizer_torch_compat_load_call", default=None
)


# -- C pickler hooks ----------------------------------------------------------------


class _HookInFront:
    """Mixin for a pickle.Pickler / Unpickler subclass: its ``_tz_hook`` sees
    every persistent_id / persistent_load call first; the hook torch installs
    (in a subclass, or by assignment after construction) becomes
    ``_tz_fallback``."""

    _tz_base: type  # pickle.Pickler or pickle.Unpickler
    _tz_name: str  # "persistent_id" or "persistent_load"

    def _tz_install(self) -> None:
        slot = self._tz_base.__dict__.get(self._tz_name)
        if inspect.isgetsetdescriptor(slot):
            # The C (un)pickler caches its hook when constructed and sees
            # later changes only through this slot.
            try:
                fallback = slot.__get__(self, type(self))
            except AttributeError:
                fallback = None
            object.__setattr__(self, "_tz_fallback", fallback)
            slot.__set__(self, self._tz_hook)
        else:
            object.__setattr__(self, "_tz_fallback", getattr(self, self._tz_name, None))
            object.__setattr__(self, self._tz_name, self._tz_hook)

    def __setattr__(self, name, value):
        if name == self._tz_name:
            object.__setattr__(self, "_tz_fallback", value)
            return
        super().__setattr__(name, value)

    def _tz_hook(self, obj):
        # Abstract: the saving and loading subclasses each define their hook.
        raise NotImplementedError(f"{type(self).__name__} defines no _tz_hook")


# -- saving ---------------------------------------------------------------------------


def _storage_parts(obj) -> Tuple[Any, Optional[torch.dtype]]:
    """(untyped storage, dtype or None) of a TypedStorage / UntypedStorage."""
    if isinstance(obj, torch.TypedStorage):
        return obj._untyped_storage, obj.dtype
    return obj, None


def _byte_view(storage) -> torch.Tensor:
    """A 1-D uint8 tensor over all of `storage`."""
    # torch.tensor rather than torch.empty: no_init_or_tensor patches the latter.
    t = torch.tensor((), dtype=torch.uint8, device=storage.device)
    return t.set_(storage, 0, (storage.nbytes(),), (1,))


class _SaveCall:
    """Sidecar target and hooks of one wrapped torch.save call."""

    __slots__ = ("target", "config")

    def __init__(self, target, config: _SaveConfig):
        self.target = target
        self.config = config

    def write(self, views: List[torch.Tensor]) -> None:
        kwargs = dict(self.config.kwargs)
        if self.config.save_func is not None:
            self.config.save_func(self.target, views, kwargs)
            return
        serializer = TensorSerializer(self.target, **kwargs)
        serializer.write_state_dict(views)
        serializer.close()


class _SidecarPickler(_HookInFront, pickle.Pickler):
    """Pickles each storage with data as a reference into the sidecar;
    torch's own persistent_id (from its subclass) handles everything else."""

    _tz_base = pickle.Pickler
    _tz_name = "persistent_id"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._tz_call: Optional[_SaveCall] = _save_call.get()
        self._tz_views: List[torch.Tensor] = []
        self._tz_ids: Dict[tuple, int] = {}
        self._tz_install()

    def _tz_hook(self, obj):
        if self._tz_call is not None and torch.is_storage(obj):
            storage, dtype = _storage_parts(obj)
            if storage.device.type != "meta" and storage.data_ptr() != 0:
                # Identity of the memory, so every view of it maps to one entry
                key = (storage.device, storage.data_ptr(), storage.nbytes())
                idx = self._tz_ids.get(key)
                if idx is None:
                    idx = self._tz_ids[key] = len(self._tz_views)
                    self._tz_views.append(_byte_view(storage))
                return (_PID_TAG, _PID_VERSION, "storage", idx, dtype)
        fallback = self._tz_fallback
        return fallback(obj) if fallback is not None else None

    def dump(self, obj):
        try:
            super().dump(obj)
            views = self._tz_views
        finally:
            self._tz_views, self._tz_ids = [], {}
        # Nothing to store: no sidecar, as upstream
        if views and self._tz_call is not None:
            self._tz_call.write(views)


# -- loading ----------------------------------------------------------------------------


def _location_tag(device: torch.device) -> str:
    """torch's location tag for storages on `device` ("cpu", "cuda:0", ...)."""
    if device.type == "cuda" and device.index is None:
        # Without CUDA the load can only succeed if map_location remaps "cuda:0".
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        device = torch.device("cuda", index)
    return str(device)


def _as_untyped(storage):
    return storage._untyped_storage if isinstance(storage, torch.TypedStorage) else storage


class _LoadCall:
    """Sidecar target, hooks and map_location of one wrapped torch.load call;
    loads the sidecar once, on its first storage reference."""

    def __init__(self, target, config: _LoadConfig, map_location):
        self.target = target
        self.config = config
        self.map_location = map_location
        self._storages: Optional[List[Any]] = None

    def storage(self, idx, dtype: Optional[torch.dtype]):
        if self._storages is None:
            self._storages = self._load()
        storages = self._storages
        if not isinstance(idx, int) or not 0 <= idx < len(storages):
            raise pickle.UnpicklingError(
                f"tensorizer sidecar {self.target!r} holds {len(storages)}"
                f" storages; the pickle refers to storage {idx!r}"
                " (is the sidecar from another torch.save?)"
            )
        # torch loads an UntypedStorage as a uint8 TypedStorage too.
        return torch.TypedStorage(
            wrap_storage=storages[idx],
            dtype=torch.uint8 if dtype is None else dtype,
            _internal=True,
        )

    def release(self) -> None:
        self._storages = None

    def _placement(self) -> Tuple[Optional[torch.device], Optional[Callable], str]:
        """(device to load to, callable map_location or None, location tag)."""
        requested = self.config.kwargs.get("device")
        if requested is None:
            default = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            default = torch.device(requested)
        tag = _location_tag(default)
        ml = self.map_location
        if ml is None:
            return None, None, tag  # the deserializer's device= decides
        if isinstance(ml, bytes):
            ml = ml.decode()
        if isinstance(ml, (str, torch.device)):
            return torch.device(ml), None, tag
        if isinstance(ml, dict):
            return torch.device(str(ml.get(tag, tag))), None, tag
        if callable(ml):
            return torch.device("cpu"), ml, tag
        raise TypeError(
            "map_location: expected a str, torch.device, dict or callable,"
            f" got {type(ml).__name__}"
        )

    def _load(self) -> List[Any]:
        device, mapper, tag = self._placement()
        kwargs = dict(self.config.kwargs)
        if device is not None:
            kwargs["device"] = device
        load_func = self.config.load_func
        effective = kwargs.get("device")
        if load_func is None and effective is not None and torch.device(effective).type == "meta":
            return self._meta_storages(kwargs)
        if load_func is not None:
            tensors = list(load_func(self.target, kwargs))
        else:
            with TensorDeserializer(self.target, **kwargs) as deserializer:
                tensors = deserializer.tree()
            if not isinstance(tensors, list):
                raise pickle.UnpicklingError(
                    f"{self.target!r} is not a torch_compat sidecar"
                    " (its tensors do not form a list)"
                )
        storages = []
        for t in tensors:
            if device is not None and t.device != device:
                t = t.to(device)
            storage = t.untyped_storage()
            if mapper is not None:
                mapped = mapper(storage, tag)
                if mapped is None:
                    mapped = torch.serialization.default_restore_location(storage, tag)
                storage = _as_untyped(mapped)
            storages.append(storage)
        return storages

    def _meta_storages(self, kwargs) -> List[Any]:
        # Sizes come from the sidecar's metadata; no tensor data is read.
        kwargs.pop("device", None)
        kwargs["lazy_load"] = True
        with TensorDeserializer(self.target, **kwargs) as deserializer:
            entries = sorted(deserializer._entries, key=lambda e: e.path)
            return [torch.UntypedStorage(e.nbytes, device="meta") for e in entries]


class _SidecarUnpickler(_HookInFront, pickle.Unpickler):
    """Resolves sidecar references; anything else goes to torch's handler,
    which torch assigns after construction."""

    _tz_base = pickle.Unpickler
    _tz_name = "persistent_load"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._tz_call: Optional[_LoadCall] = _load_call.get()
        self._tz_install()

    def _tz_hook(self, pid):
        if isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == _PID_TAG:
            if self._tz_call is None or self._tz_call.target is None:
                raise pickle.UnpicklingError(
                    "this file keeps its tensors in a tensorizer sidecar, but"
                    " its location is unknown; give tensorizer_loading a file_obj"
                )
            version, kind = pid[1], pid[2]
            if version != _PID_VERSION:
                raise pickle.UnpicklingError(
                    f"Unsupported TensorizerPickler data version ({version!r})"
                )
            if kind != "storage" or len(pid) != 5:
                raise pickle.UnpicklingError(
                    f"Unsupported TensorizerPickler object type ({kind!r})"
                )
            return self._tz_call.storage(pid[3], pid[4])
        fallback = self._tz_fallback
        if fallback is None:
            raise pickle.UnpicklingError("unsupported persistent id encountered")
        return fallback(pid)

    def load(self):
        try:
            return super().load()
        finally:
            # The result holds what it needs; drop the rest promptly.
            if self._tz_call is not None:
                self._tz_call.release()


def _make_pickle_module() -> types.ModuleType:
    module = types.ModuleType("tensorizer_torch_compat_pickle")
    for name in dir(pickle):
        if not name.startswith("__"):
            setattr(module, name, getattr(pickle, name))
    module.Pickler = _SidecarPickler
    module.Unpickler = _SidecarUnpickler
    return module


_pickle_module = _make_pickle_module()


# -- the torch.save / torch.load wrappers -----------------------------------------------


def _default_sidecar(f):
    """``<path>.tensors`` for torch.save's / torch.load's `f`, or None."""
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.fsdecode(f) + ".tensors"
    name = None if isinstance(f, io.BytesIO) else getattr(f, "name", None)
    if isinstance(name, (str, bytes, os.PathLike)):
        return os.fsdecode(name) + ".tensors"
    logger.warning(
        "Cannot infer a .tensors location from %s; not using the tensorizer"
        " backend for this call (pass file_obj to choose a location)",
        type(f).__name__,
    )
    return None


def _sidecar_target(file_obj, f):
    if file_obj is None:
        return _default_sidecar(f)
    if callable(file_obj):
        return file_obj(f)
    return file_obj


def _check_pickle_module(pickle_module) -> None:
    if pickle_module is not None and pickle_module is not pickle:
        raise ValueError(
            "tensorizer_saving / tensorizer_loading cannot be combined with a"
            f" custom pickle_module ({pickle_module!r})"
        )


# What torch.save / torch.load were when the first context patched them.
_originals: Dict[str, Callable] = {
    "save": torch.serialization.save,
    "load": torch.serialization.load,
}
_patch_lock = threading.Lock()
_patch_users: Dict[str, int] = {"save": 0, "load": 0}


def _bind(name: str, args, kwargs):
    """torch.<name>'s arguments, bound to its signature by name."""
    return _SIGNATURES[name].bind(*args, **kwargs)


def _run(name: str, bound, call_var: ContextVar, call):
    """The original torch.<name> with `call` visible to our (un)pickler."""
    bound.arguments["pickle_module"] = _pickle_module
    token = call_var.set(call)
    try:
        return _originals[name](*bound.args, **bound.kwargs)
    finally:
        call_var.reset(token)


def _save_wrapper(*args, **kwargs):
    config = _save_config.get()
    if config is None:
        return _originals["save"](*args, **kwargs)
    bound = _bind("save", args, kwargs)
    _check_pickle_module(bound.arguments.get("pickle_module", pickle))
    target = _sidecar_target(config.file_obj, bound.arguments["f"])
    if target is None:
        return _originals["save"](*args, **kwargs)
    return _run("save", bound, _save_call, _SaveCall(target, config))


def _weights_only(config: _LoadConfig, requested: Optional[bool]) -> Optional[bool]:
    """The weights_only to pass on, or an explaining error (see tensorizer_loading)."""
    forced = os.getenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in (
        "1", "y", "yes", "true",
    )
    if config.suppress_weights_only:
        if forced:
            raise RuntimeError(
                "TORCH_FORCE_WEIGHTS_ONLY_LOAD is set, which tensorizer_loading"
                " cannot honour or override (torch refuses weights_only loads"
                " with a custom pickle module)"
            )
        return False
    if requested or (requested is None and forced):
        # Opens with torch's own message for this case, which upstream's
        # users may match on.
        raise RuntimeError(
            "Can not safely load weights when explicit pickle_module is"
            " specified: torch.load(weights_only=True) cannot be used inside"
            " tensorizer_loading: torch only restricts unpickling with its own"
            " pickle module, and tensorizer needs its own to find the tensors"
            " in the sidecar. Pass weights_only=False (or leave it unset) for"
            " files you trust, or use"
            " tensorizer_loading(suppress_weights_only=True) to turn"
            " weights_only=True into False."
        )
    return requested


def _load_wrapper(*args, **kwargs):
    config = _load_config.get()
    if config is None:
        return _originals["load"](*args, **kwargs)
    bound = _bind("load", args, kwargs)
    arguments = bound.arguments
    _check_pickle_module(arguments.get("pickle_module"))
    weights_only = _weights_only(config, arguments.get("weights_only"))
    if weights_only is not None:
        arguments["weights_only"] = weights_only
    target = _sidecar_target(config.file_obj, arguments["f"])
    call = _LoadCall(target, config, arguments.get("map_location"))
    try:
        return _run("load", bound, _load_call, call)
    finally:
        call.release()


_SIGNATURES = {
    "save": inspect.signature(torch.serialization.save),
    "load": inspect.signature(torch.serialization.load),
}
functools.update_wrapper(_save_wrapper, torch.serialization.save)
functools.update_wrapper(_load_wrapper, torch.serialization.load)
# inspect.signature(..., follow_wrapped=False) then shows torch's parameters,
# as for the functions the wrappers stand in for.
_save_wrapper.__signature__ = _SIGNATURES["save"]
_load_wrapper.__signature__ = _SIGNATURES["load"]
# torch.load's default pickle_module (None since torch 1.13), upstream's name.
_LOAD_WRAPPER_DEFAULT_MODULE: Any = _SIGNATURES["load"].parameters["pickle_module"].default
_WRAPPERS = {"save": _save_wrapper, "load": _load_wrapper}


@contextlib.contextmanager
def _active(name: str, config_var: ContextVar, config):
    """Keep torch.<name> wrapped while any context (in any thread) needs it,
    and `config` in force for this thread / task."""
    with _patch_lock:
        if _patch_users[name] == 0:
            current = getattr(torch, name)
            if current is not _WRAPPERS[name]:
                _originals[name] = current
                setattr(torch, name, _WRAPPERS[name])
        _patch_users[name] += 1
    token = config_var.set(config)
    try:
        yield
    finally:
        config_var.reset(token)
        with _patch_lock:
            _patch_users[name] -= 1
            if _patch_users[name] == 0 and getattr(torch, name) is _WRAPPERS[name]:
                setattr(torch, name, _originals[name])


@contextlib.contextmanager
def tensorizer_saving(file_obj=None, *, save_func=None, **kwargs):
    """
    Make ``torch.save`` keep tensor storages in a tensorizer sidecar file.

    ``torch.save(obj, f)`` in this context writes the pickled structure to
    ``f`` and the storages to the sidecar; load both with
    :func:`tensorizer_loading` and ``torch.load``. Only calls made in this
    thread / async task are affected. Contexts nest; the innermost applies.

    Args:
        file_obj: Where to write the sidecar: anything ``TensorSerializer``
            accepts (path, URI, file object), or a callable given the
            ``torch.save`` target ``f`` and returning one (None: plain torch
            for that call). Default: ``f`` (or ``f.name``) + ``".tensors"``.
        save_func: Optional ``save_func(file_obj, tensors, kwargs)`` that
            stores the list of 1-D ``uint8`` storage tensors instead of the
            default ``TensorSerializer(file_obj, **kwargs)``, e.g. in a
            background thread.
        kwargs: Passed to ``TensorSerializer`` (e.g. ``encryption=``).
    """
    with _active("save", _save_config, _SaveConfig(file_obj, save_func, dict(kwargs))):
        yield


@contextlib.contextmanager
def tensorizer_loading(
    file_obj=None, *, load_func=None, suppress_weights_only=False, **kwargs
):
    """
    Make ``torch.load`` read tensor storages from a tensorizer sidecar file
    written under :func:`tensorizer_saving` (or upstream's equivalent).
    Files without sidecar references load as usual.

    Args:
        file_obj: Where to read the sidecar: anything ``TensorDeserializer``
            accepts, or a callable given the ``torch.load`` source ``f`` and
            returning one. Default: ``f`` (or ``f.name``) + ``".tensors"``.
        load_func: Optional ``load_func(file_obj, kwargs) -> Iterable[Tensor]``
            returning the storage tensors in order, instead of the default
            ``TensorDeserializer(file_obj, **kwargs)``.
        suppress_weights_only: Turn ``torch.load(weights_only=True)`` into
            ``weights_only=False`` instead of refusing it. Only for files you
            trust: the pickle is then unrestricted.
        kwargs: Passed to ``TensorDeserializer`` (e.g. ``device=``,
            ``num_readers=``, ``encryption=``, ``verify_hash=``).
            ``torch.load``'s ``map_location``, when given, overrides
            ``device``.
    """
    if load_func is None:
        if kwargs.get("dtype") is not None:
            raise ValueError(
                "tensorizer_loading: dtype cannot be used, since the sidecar"
                " holds raw storage bytes (cast the loaded tensors instead)"
            )
        if kwargs.get("filter_func") is not None:
            raise ValueError(
                "tensorizer_loading: filter_func cannot be used, since every"
                " storage in the sidecar is referenced by position"
            )
    config = _LoadConfig(file_obj, load_func, bool(suppress_weights_only), dict(kwargs))
    with _active("load", _load_config, config):
        yield
