"""Miscellaneous helpers: byte formatting, devices, memory statistics and
``no_init_or_tensor`` for building models without allocating weights."""

import contextlib
import contextvars
import threading
from typing import Callable, ContextManager, NamedTuple, Optional, TypeVar, Union

import psutil
import torch

try:
    import resource
except ImportError:  # not on Windows
    resource = None

__all__ = [
    "convert_bytes",
    "get_device",
    "GlobalGPUMemoryUsage",
    "TorchGPUMemoryUsage",
    "CPUMemoryUsage",
    "MemoryUsage",
    "get_mem_usage",
    "get_gpu_name",
    "no_init_or_tensor",
]

_pynvml = None
_pynvml_checked = False
_pynvml_lock = threading.Lock()


def _get_pynvml():
    # Only consulted when torch.cuda.mem_get_info is missing; imported lazily.
    global _pynvml, _pynvml_checked
    with _pynvml_lock:
        if not _pynvml_checked:
            _pynvml_checked = True
            try:
                import pynvml

                pynvml.nvmlInit()
                _pynvml = pynvml
            except Exception:
                _pynvml = None
        return _pynvml


def convert_bytes(num, decimal=True) -> str:
    """
    Format a byte count for humans.

    Args:
        num: Number of bytes.
        decimal: Steps of 1000 (KB, MB, ...) if True, else of 1024
            (KiB, MiB, ...).

    Returns:
        A string like ``"123.4 MB"`` or ``"1.5 KiB"``.
    """
    if decimal:
        step = 1000.0
        units = ("bytes", "KB", "MB", "GB", "TB", "PB")
    else:
        step = 1024.0
        units = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB")
    unit = units[-1]
    for candidate in units[:-1]:
        if num < step:
            unit = candidate
            break
        num /= step
    return "%3.1f %s" % (num, unit)


def get_device() -> torch.device:
    """``cuda`` if CUDA is available, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class GlobalGPUMemoryUsage(NamedTuple):
    """Memory usage of one GPU across all processes."""

    total: int
    free: int
    used: int

    @classmethod
    def now(cls, device=None) -> Optional["GlobalGPUMemoryUsage"]:
        """Snapshot of (total, free, used) bytes, or None without CUDA."""
        if not torch.cuda.is_available():
            return None
        mem_get_info = getattr(torch.cuda, "mem_get_info", None)
        if mem_get_info is not None:
            free, total = mem_get_info(device)
            return cls(total, free, total - free)
        pynvml = _get_pynvml()
        if pynvml is None:
            return None
        if isinstance(device, (int, str, bytes)):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type == "cpu":
                return None
            device = device.index
        if device is None:
            device = torch.cuda.current_device()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return cls(info.total, info.free, info.used)

    def __str__(self):
        return "GPU: (U: {:,}MiB F: {:,}MiB T: {:,}MiB)".format(
            self.used >> 20, self.free >> 20, self.total >> 20
        )


class TorchGPUMemoryUsage(NamedTuple):
    """PyTorch's own memory usage on one GPU."""

    reserved: int
    reserved_max: int
    used: int
    used_max: int

    @classmethod
    def now(cls, device=None) -> Optional["TorchGPUMemoryUsage"]:
        """Snapshot of PyTorch's allocator statistics, or None without CUDA."""
        if not torch.cuda.is_available():
            return None
        stats = torch.cuda.memory.memory_stats(device)
        return cls(
            stats.get("reserved_bytes.all.current", 0),
            stats.get("reserved_bytes.all.peak", 0),
            stats.get("allocated_bytes.all.current", 0),
            stats.get("allocated_bytes.all.peak", 0),
        )

    def __str__(self):
        return "TORCH: (R: {:,}MiB/{:,}MiB, A: {:,}MiB/{:,}MiB)".format(
            self.reserved >> 20,
            self.reserved_max >> 20,
            self.used >> 20,
            self.used_max >> 20,
        )


class CPUMemoryUsage(NamedTuple):
    """Host memory statistics: peak RSS (self + children) and available RAM."""

    maxrss: int
    free: int

    @classmethod
    def now(cls) -> "CPUMemoryUsage":
        if resource is not None:
            maxrss = (
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            ) << 10
        else:
            process = psutil.Process()
            maxrss = process.memory_info().rss + sum(
                p.memory_info().rss for p in process.children(True)
            )
        return cls(maxrss, psutil.virtual_memory().available)

    def __str__(self):
        return "CPU: (maxrss: {:,}MiB F: {:,}MiB)".format(
            self.maxrss >> 20, self.free >> 20
        )


class MemoryUsage(NamedTuple):
    """CPU, GPU and PyTorch memory statistics together."""

    cpu: CPUMemoryUsage
    gpu: Optional[GlobalGPUMemoryUsage]
    torch: Optional[TorchGPUMemoryUsage]

    @classmethod
    def now(cls, device=None) -> "MemoryUsage":
        gpu_info = torch_info = None
        try:
            gpu_info = GlobalGPUMemoryUsage.now(device)
            torch_info = TorchGPUMemoryUsage.now(device)
        except AssertionError:
            pass
        return cls(CPUMemoryUsage.now(), gpu_info, torch_info)

    def __str__(self):
        return " ".join(str(item) for item in self if item)


def get_mem_usage() -> str:
    """``str(MemoryUsage.now())``."""
    return str(MemoryUsage.now())


def get_gpu_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "N/A"


Model = TypeVar("Model")


def no_init_or_tensor(
    loading_code: Optional[Callable[..., Model]] = None,
) -> Union[Model, ContextManager]:
    """
    Suppress weight initialization and allocation while building a model.

    While active, ``reset_parameters`` of ``nn.Linear``, ``nn.Embedding`` and
    ``nn.LayerNorm`` does nothing and ``torch.empty`` creates meta tensors.
    The state is tracked per thread / async task, so other code is unaffected.

    Args:
        loading_code: A callable to run with initialization suppressed, or
            None to get a context manager.

    Returns:
        The callable's result, or a context manager if `loading_code` is None.
    """
    if loading_code is None:
        return _NoInitOrTensorImpl.context_manager()
    elif callable(loading_code):
        with _NoInitOrTensorImpl.context_manager():
            return loading_code()
    else:
        raise TypeError(
            "no_init_or_tensor() expected a callable to evaluate,"
            " or None if being used as a context manager;"
            f' got an object of type "{type(loading_code).__name__}" instead.'
        )


class _NoInitOrTensorImpl:
    # Namespace for the global patches behind no_init_or_tensor().
    # Patches are installed when the first context (in any thread) is entered
    # and removed when the last one exits; a ContextVar decides whether the
    # patched functions act, so unrelated threads and tasks see no change.
    _MODULES = (torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm)
    _MODULE_ORIGINALS = tuple((m, m.__dict__["reset_parameters"]) for m in _MODULES)
    _ORIGINAL_EMPTY = getattr(torch._C._VariableFunctions, "empty", torch.empty)

    is_active = contextvars.ContextVar(
        "_NoInitOrTensorImpl.is_active", default=False
    )
    _count_active: int = 0
    _count_active_lock = threading.Lock()

    @classmethod
    @contextlib.contextmanager
    def context_manager(cls):
        if cls.is_active.get():
            # Re-entrant: the outer context already holds the patches
            yield
            return
        with cls._count_active_lock:
            cls._count_active += 1
            if cls._count_active == 1:
                for mod, original in cls._MODULE_ORIGINALS:
                    mod.reset_parameters = cls._disable(original)
                torch.empty = cls._meta_empty
        token = cls.is_active.set(True)
        try:
            yield
        finally:
            cls.is_active.reset(token)
            with cls._count_active_lock:
                cls._count_active -= 1
                if cls._count_active == 0:
                    torch.empty = cls._ORIGINAL_EMPTY
                    for mod, original in cls._MODULE_ORIGINALS:
                        mod.reset_parameters = original

    @staticmethod
    def _disable(func):
        def reset_parameters(*args, **kwargs):
            if not _NoInitOrTensorImpl.is_active.get():
                return func(*args, **kwargs)

        reset_parameters.__wrapped__ = func
        return reset_parameters

    @staticmethod
    def _meta_empty(*args, **kwargs):
        if _NoInitOrTensorImpl.is_active.get():
            kwargs["device"] = "meta"
        return _NoInitOrTensorImpl._ORIGINAL_EMPTY(*args, **kwargs)

    __init__ = None
