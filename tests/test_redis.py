"""Redis: ``to_redis`` with a redis-py client, then loading from
``redis://`` with a real redis-server on loopback: structured names,
meta and empty tensors, encrypted files, AUTH and databases, and upstream
2.12.1 in both directions."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import servers
from tensorizer import (
    DecryptionParams,
    EncryptionParams,
    TensorDeserializer,
    TensorSerializer,
    stream_io,
)

pytestmark = [
    pytest.mark.ours_only,  # upstream cannot store structured names or empty tensors in Redis
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed"),
]

KEY = bytes(range(32))


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    with servers.RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


def _sd():
    g = torch.Generator().manual_seed(3)
    return {
        "big": torch.randn(2 * 1024 * 1024 + 3, generator=g),
        "layers": [{"w": torch.randn(30, 20, generator=g)}, {"w": torch.ones(4, dtype=torch.bfloat16)}],
        "empty": torch.zeros(0),
        "meta": torch.empty(5, device="meta"),
        "last": torch.arange(7),
    }


def _expected(sd):
    out = {}
    for k, v in sd.items():
        if isinstance(v, list):
            out[k] = [{kk: vv for kk, vv in d.items()} for d in v]
        else:
            out[k] = torch.zeros(v.shape, dtype=v.dtype) if v.is_meta else v
    return out


def _check(t, sd):
    tree = t.tree()
    exp = _expected(sd)
    assert set(tree.keys()) == set(exp.keys())
    for k, v in exp.items():
        if isinstance(v, list):
            for got, want in zip(tree[k], v):
                for kk in want:
                    assert torch.equal(got[kk], want[kk])
        else:
            assert torch.equal(tree[k], v), k


@pytest.mark.parametrize("encrypted", [False, True])
def test_to_redis_then_load(tmp_path, redis_server, encrypted):
    sd = _sd()
    path = tmp_path / "m.tensors"
    enc = EncryptionParams(KEY) if encrypted else None
    with TensorSerializer(path, encryption=enc) as s:
        s.write_state_dict(sd)
    dec = DecryptionParams.from_key(KEY) if encrypted else None
    prefix = f"model-{encrypted}"
    with TensorDeserializer(path, encryption=dec, lazy_load=True) as t:
        t.to_redis(redis_server.client(), prefix)
    client = redis_server.client()
    assert client.exists(f"{prefix}:header:0")
    for num_readers in (1, 4):
        with TensorDeserializer(
            redis_server.uri(prefix), encryption=dec, verify_hash=True, num_readers=num_readers
        ) as t:
            _check(t, sd)
    # The stream API reads the same bytes.
    data = path.read_bytes()
    with stream_io.open_stream(redis_server.uri(prefix)) as f:
        assert isinstance(f, stream_io.RedisStreamFile)  # as upstream's open_stream
        assert f.read(73) == data[:73]
    # Upstream's class, with a range: the header and data keys read as one file.
    with stream_io.RedisStreamFile(redis_server.uri(prefix), begin=50, end=len(data) - 10) as f:
        assert f.read() == data[50:-10]
        f.seek(60)
        assert f.read(100) == data[60:160]
        assert f.setup_latency > 0 and len(f.response_latencies) == f.read_operations >= 1
    with pytest.raises(ValueError, match="redis://"):
        stream_io.RedisStreamFile("http://localhost/x")


def test_reads_are_bytearrays_and_bytes_read_counts_the_transfer(tmp_path, redis_server):
    sd = {"a": torch.randn(256, 256), "b": torch.arange(10)}
    path = tmp_path / "c.tensors"
    with TensorSerializer(path) as s:
        s.write_state_dict(sd)
    with TensorDeserializer(path, lazy_load=True) as t:
        t.to_redis(redis_server.client(), "counted")
    data = path.read_bytes()
    with stream_io.open_stream(redis_server.uri("counted")) as f:
        head = f.read(5)
        rest = f.read()
        assert type(head) is bytearray and type(rest) is bytearray  # as upstream's stream
        # (to_redis leaves out the padding at the end of the file)
        assert data.startswith(head + rest) and len(head + rest) > len(data) - 64 and f.read() == bytearray()
    # Upstream counts what came from Redis: header, metadata and all tensors
    # (about the whole file), not only the tensors' bytes as for a local file.
    with TensorDeserializer(path) as t:
        assert t.total_bytes_read == t.total_tensor_bytes
    t = TensorDeserializer(redis_server.uri("counted"))
    assert t.total_tensor_bytes < len(data) - 4096 < t.total_bytes_read <= len(data)
    t.close()
    assert t.total_bytes_read > len(data) - 4096
    with TensorDeserializer(redis_server.uri("counted"), lazy_load=True) as t:
        before = t.total_bytes_read
        assert before < t.total_tensor_bytes
        t["a"]
        assert t.total_bytes_read > before + 256 * 256 * 4 - 1


def test_pipelined_reads_beyond_the_window(tmp_path, redis_server):
    # 60 MiB in 61 tensors on one reader: the GETRANGEs of one request run
    # ahead of their replies in windows of 32 MiB.
    g = torch.Generator().manual_seed(11)
    sd = {f"w{i}": torch.randn(256 * 1024, generator=g) for i in range(60)}
    sd["tail"] = torch.arange(3)
    path = tmp_path / "p.tensors"
    with TensorSerializer(path) as s:
        s.write_state_dict(sd)
    with TensorDeserializer(path, lazy_load=True) as t:
        t.to_redis(redis_server.client(), "pipelined")
    with TensorDeserializer(redis_server.uri("pipelined"), num_readers=1, verify_hash=True) as t:
        for k, v in sd.items():
            assert torch.equal(t[k], v), k


def test_force_and_filter(tmp_path, redis_server):
    path = tmp_path / "f.tensors"
    with TensorSerializer(path) as s:
        s.write_state_dict({"a": torch.ones(3), "b": torch.zeros(2)})
    client = redis_server.client()
    with TensorDeserializer(path, filter_func=lambda n: n == "a") as t:
        t.to_redis(client, "filtered")
    keys = sorted(k.decode() for k in client.scan_iter("filtered:*"))
    assert [k.split(":")[1] for k in keys] == ["a", "a", "header"]
    with TensorDeserializer(redis_server.uri("filtered"), filter_func=lambda n: n == "a") as t:
        assert torch.equal(t["a"], torch.ones(3))
    # Asking for the tensor that was left out is an error, not zeros.
    with pytest.raises(ValueError, match="not stored"):  # a truncated source, as for files
        TensorDeserializer(redis_server.uri("filtered"))
    # Without force an existing tensor is left as it is.
    header_key = next(k for k in keys if k.startswith("filtered:a:") and client.strlen(k) > 20)
    client.set(header_key, client.get(header_key))
    with TensorDeserializer(path) as t:
        t.to_redis(client, "filtered")  # "a" skipped, "b" added
    assert any(k.startswith(b"filtered:b:") for k in client.scan_iter("filtered:*"))


def test_auth_and_database(tmp_path):
    path = tmp_path / "x.tensors"
    with TensorSerializer(path) as s:
        s.write_state_dict({"x": torch.arange(5)})
    with servers.RedisServer(tmp_path / "authed", password="s3cret-pw") as server:
        with TensorDeserializer(path) as t:
            t.to_redis(server.client(db=2), "p")
        with TensorDeserializer(server.uri("p", db=2, password="s3cret-pw")) as t:
            assert torch.equal(t["x"], torch.arange(5))
        with pytest.raises(OSError, match="authentication failed") as ei:
            TensorDeserializer(server.uri("p", db=2, password="wrong-pw"))
        assert "wrong-pw" not in str(ei.value) and "s3cret" not in str(ei.value)
        with pytest.raises(FileNotFoundError):
            TensorDeserializer(server.uri("nothing-here", db=2, password="s3cret-pw"))


def test_dead_server_is_a_clear_error():
    port = servers.free_port()
    with pytest.raises(OSError, match="(?i)connect"):
        TensorDeserializer(f"redis://127.0.0.1:{port}/p")


def test_upstream_both_directions(tmp_path, redis_server, upstream):
    sd = {"w": torch.arange(1000, dtype=torch.float32), "e": torch.zeros(0), "z": torch.ones(3)}
    path = tmp_path / "ours.tensors"
    with TensorSerializer(path) as s:
        s.write_state_dict(sd)
    with TensorDeserializer(path) as t:
        t.to_redis(redis_server.client(), "ours")
    # Upstream reads what we stored, empty tensor included (we store no empty key).
    sums = upstream.run_upstream_json(
        f"""
import json
from tensorizer import TensorDeserializer
t = TensorDeserializer({redis_server.uri("ours")!r}, verify_hash=True)
print(json.dumps({{k: [list(v.shape), float(v.double().sum())] for k, v in t.items()}}))
"""
    )
    assert sums == {"w": [[1000], float(sum(range(1000)))], "e": [[0], 0.0], "z": [[3], 3.0]}
    # Upstream's to_redis (plain names, no empty tensors) read by ours.
    upstream.run_upstream(
        f"""
import redis, torch
from tensorizer import TensorSerializer, TensorDeserializer
p = {str(tmp_path / "up.tensors")!r}
s = TensorSerializer(p)
s.write_state_dict({{"w": torch.arange(1000, dtype=torch.float32), "z": torch.ones(3)}})
s.close()
TensorDeserializer(p, lazy_load=True).to_redis(redis.Redis(host="127.0.0.1", port={redis_server.port}), "up")
"""
    )
    with TensorDeserializer(redis_server.uri("up"), verify_hash=True) as t:
        assert torch.equal(t["w"], torch.arange(1000, dtype=torch.float32))
        assert torch.equal(t["z"], torch.ones(3))
