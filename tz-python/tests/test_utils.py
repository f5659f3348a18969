import asyncio
import threading

import pytest
import torch

from tensorizer import utils


@pytest.mark.parametrize(
    "num,decimal,expected",
    [
        (0, True, "0.0 bytes"),
        (999, True, "999.0 bytes"),
        (1000, True, "1.0 KB"),
        (1536, False, "1.5 KiB"),
        (1023, False, "1023.0 bytes"),
        (123_400_000, True, "123.4 MB"),
        (5 * 1024**3, False, "5.0 GiB"),
        (2 * 1000**5, True, "2.0 PB"),
        (3 * 1000**6, True, "3000.0 PB"),
    ],
)
def test_convert_bytes(num, decimal, expected):
    assert utils.convert_bytes(num, decimal) == expected


def test_get_device():
    dev = utils.get_device()
    assert dev.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_memory_usage():
    cpu = utils.CPUMemoryUsage.now()
    assert cpu.maxrss > 0 and cpu.free > 0
    assert str(cpu).startswith("CPU: (maxrss: ")
    s = utils.get_mem_usage()
    assert s.startswith("CPU: ")
    if not torch.cuda.is_available():
        assert utils.GlobalGPUMemoryUsage.now() is None
        assert utils.TorchGPUMemoryUsage.now() is None
        assert utils.get_gpu_name() == "N/A"
        assert "GPU" not in s


def _linear_is_meta():
    return torch.nn.Linear(3, 4).weight.is_meta


def test_no_init_context_manager():
    original_empty = torch.empty
    original_reset = torch.nn.Linear.reset_parameters
    with utils.no_init_or_tensor():
        assert torch.empty(2).is_meta
        assert torch.empty(2, device="cpu").is_meta
        m = torch.nn.Linear(3, 4)
        assert m.weight.is_meta
        # Re-entrant
        with utils.no_init_or_tensor():
            assert torch.empty(1).is_meta
        assert torch.empty(1).is_meta
    assert torch.empty is original_empty
    assert torch.nn.Linear.reset_parameters is original_reset
    assert not torch.empty(2).is_meta
    assert not _linear_is_meta()


def test_no_init_callable():
    m = utils.no_init_or_tensor(lambda: torch.nn.Embedding(5, 2))
    assert m.weight.is_meta
    with pytest.raises(TypeError):
        utils.no_init_or_tensor(5)


def test_no_init_is_thread_local():
    inside = threading.Event()
    release = threading.Event()
    results = {}

    def worker():
        with utils.no_init_or_tensor():
            inside.set()
            release.wait(10)
            results["worker"] = torch.empty(1).is_meta

    t = threading.Thread(target=worker)
    t.start()
    assert inside.wait(10)
    # Patches are installed, but inactive in this thread
    results["main"] = torch.empty(1).is_meta
    results["main_linear"] = _linear_is_meta()
    release.set()
    t.join()
    assert results == {"worker": True, "main": False, "main_linear": False}
    assert not torch.empty(1).is_meta


def test_no_init_async_tasks():
    async def inside():
        with utils.no_init_or_tensor():
            await asyncio.sleep(0.01)
            return torch.empty(1).is_meta

    async def outside():
        await asyncio.sleep(0.005)
        return torch.empty(1).is_meta

    async def main():
        return await asyncio.gather(inside(), outside())

    assert asyncio.run(main()) == [True, False]


def test_no_init_exception_restores():
    original_empty = torch.empty
    with pytest.raises(RuntimeError):
        with utils.no_init_or_tensor():
            raise RuntimeError("boom")
    assert torch.empty is original_empty
