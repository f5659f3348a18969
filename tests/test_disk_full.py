"""A save that runs out of space fails with a clear OSError and loses nothing
that earlier write calls stored. RLIMIT_FSIZE stands in for a full disk, so
the test needs no privileges."""
import subprocess
import sys
import textwrap

import torch

from tensorizer import TensorDeserializer

CHILD = textwrap.dedent(
    """
    import resource, signal, sys, torch
    from tensorizer import TensorSerializer
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    s = TensorSerializer(sys.argv[1])
    s.write_state_dict({"small": torch.arange(10, dtype=torch.float32)})
    try:
        s.write_state_dict({"big": torch.ones(1 << 20)})
    except OSError as e:
        print("OSError:", e)
    else:
        print("no error")
    try:
        s.close()
    except OSError:
        pass
    """
)


def test_full_disk_keeps_earlier_tensors(tmp_path):
    path = tmp_path / "full.tensors"
    result = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OSError:"), result.stdout
    assert str(path) in result.stdout
    with TensorDeserializer(path, verify_hash=True) as d:
        assert list(d.keys()) == ["small"]
        assert torch.equal(d["small"], torch.arange(10, dtype=torch.float32))
