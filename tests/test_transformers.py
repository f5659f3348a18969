"""Hugging Face transformers models through tensorizer, with no download.

Tiny GPT-2 (tied input/output embeddings) and Llama (rotary buffers, grouped
KV heads) models are built from configs with seeded random weights, then
saved and loaded

* with ``torch.save`` / ``torch.load`` inside ``tensorizer_saving`` /
  ``tensorizer_loading`` (whole model and state dict), and
* with ``TensorSerializer.write_module`` / ``TensorDeserializer.load_into_module``
  into a model built under ``no_init_or_tensor``,

and must give bit-identical logits for a fixed input.
"""

from __future__ import annotations

import os

# Never reach a model hub: everything here is built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from tensorizer import TensorDeserializer, TensorSerializer  # noqa: E402
from tensorizer.torch_compat import tensorizer_loading, tensorizer_saving  # noqa: E402
from tensorizer.utils import no_init_or_tensor  # noqa: E402

try:
    import transformers  # noqa: E402
except ImportError:  # pragma: no cover - depends on the environment
    if os.environ.get("TZ_REQUIRE_UPSTREAM", "").strip() not in ("", "0", "false", "no"):
        raise  # the full test environment (scripts/setup.sh) installs it
    pytest.skip("transformers is not installed (scripts/setup.sh installs it)", allow_module_level=True)


def _gpt2():
    config = transformers.GPT2Config(
        vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    return config, transformers.GPT2LMHeadModel


def _llama():
    config = transformers.LlamaConfig(
        vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    return config, transformers.LlamaForCausalLM


MODELS = {"gpt2": _gpt2, "llama": _llama}
IDS = torch.tensor([[3, 14, 15, 9, 2, 6, 5, 35, 8, 9]])


def _build(kind):
    config, cls = MODELS[kind]()
    config._attn_implementation = "eager"
    torch.manual_seed(1234)
    model = cls(config).eval()
    # Nonzero everywhere (some inits leave biases or norms at constants)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return config, cls, model


def _logits(model):
    with torch.no_grad():
        return model(IDS).logits


def _tied(model):
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_whole_model_through_torch_compat(tmp_path, kind):
    _, cls, model = _build(kind)
    expected = _logits(model)
    path = tmp_path / "model.pt"
    with tensorizer_saving():
        torch.save(model, path)
    assert (tmp_path / "model.pt.tensors").is_file()
    # the .pt keeps only structure
    assert path.stat().st_size < (tmp_path / "model.pt.tensors").stat().st_size
    with tensorizer_loading(device="cpu", num_readers=2):
        loaded = torch.load(path, weights_only=False)
    assert type(loaded) is cls
    assert _tied(loaded) == _tied(model)
    assert torch.equal(_logits(loaded.eval()), expected)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_state_dict_through_torch_compat(tmp_path, kind):
    config, cls, model = _build(kind)
    expected = _logits(model)
    with tensorizer_saving():
        torch.save(model.state_dict(), tmp_path / "sd.pt")
    with tensorizer_loading(device="cpu"):
        sd = torch.load(tmp_path / "sd.pt")  # weights_only left to the default
    with torch.device("meta"):
        fresh = cls(config)
    fresh.load_state_dict(sd, assign=True)
    fresh.tie_weights()
    # rotary and other non-persistent buffers are not in a state dict
    for name, buf in model.named_buffers():
        if name not in sd:
            module_name, _, attr = name.rpartition(".")
            fresh.get_submodule(module_name).register_buffer(attr, buf.clone(), persistent=False)
    assert torch.equal(_logits(fresh.eval()), expected)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_write_module_and_load_into_module(tmp_path, kind):
    config, cls, model = _build(kind)
    expected = _logits(model)
    path = tmp_path / "model.tensors"
    s = TensorSerializer(path)
    s.write_module(model)
    s.close()
    with no_init_or_tensor():
        fresh = cls(config)
    assert any(p.is_meta for p in fresh.parameters())
    with TensorDeserializer(path, device="cpu", verify_hash=True) as d:
        count = d.load_into_module(fresh)
    assert count == len(list(model.named_parameters(remove_duplicate=False))) + len(
        list(model.named_buffers(remove_duplicate=False))
    )
    assert not any(p.is_meta for p in fresh.parameters())
    assert torch.equal(_logits(fresh.eval()), expected)
