"""The offline stand-in for "EleutherAI/gpt-neo-125M" that `make
test-upstream-suite` gives upstream's suite (scripts/make_standin_model.py):
found through the hub id offline, and its weights make generation say " hello"
only when they are loaded correctly -- what the suite's check_inference relies
on to tell a good load from a bad one.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "tokenizers")),
    reason="needs torch, transformers and tokenizers",
)

ROOT = Path(__file__).resolve().parent.parent
REPO_ID = "EleutherAI/gpt-neo-125M"
N = 40


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("hf")
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_standin_model.py"), str(home)],
        check=True,
    )
    return home


def _in_offline_hub(hf_home, body):
    """Runs `body` in a fresh interpreter that sees only the stand-in hub."""
    code = (
        "import torch\n"
        "from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer\n"
        f"REPO_ID = {REPO_ID!r}; N = {N}\n"
        "tok = AutoTokenizer.from_pretrained(REPO_ID)\n"
        "ids = tok.encode(' hello' * N, return_tensors='pt')\n"
        "def hellos(model, seed=0):\n"
        "    torch.manual_seed(seed)\n"
        "    with torch.no_grad():\n"
        "        out = model.generate(ids, max_new_tokens=50, do_sample=True,\n"
        "                             pad_token_id=tok.eos_token_id)\n"
        "    return tok.decode(out[0], skip_special_tokens=True).count('hello')\n"
        + body
    )
    env = {
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PATH": "/usr/bin:/bin",
        "TOKENIZERS_PARALLELISM": "false",
    }
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_standin_is_small_gpt_neo_with_one_token_hello(hf_home):
    out = _in_offline_hub(
        hf_home,
        "config = AutoConfig.from_pretrained(REPO_ID)\n"
        "print(config.model_type, config.num_layers, config.hidden_size)\n"
        "print(len(tok.encode(' hello')), ids.shape[1])\n",
    )
    model_type, layers, hidden, hello_len, n_ids = out.split()
    assert model_type == "gpt_neo"
    assert int(layers) >= 2  # the suite filters on "transformer.h.0"
    assert int(hidden) == 768  # the suite swaps in a LayerNorm(768)
    assert int(hello_len) == 1 and int(n_ids) == N


def test_correct_weights_generate_hello(hf_home):
    out = _in_offline_hub(
        hf_home,
        "model = AutoModelForCausalLM.from_pretrained(REPO_ID)\n"
        "print(*(hellos(model, s) for s in range(3)))\n",
    )
    assert [int(x) for x in out.split()] == [N + 50] * 3


def test_zeroed_or_random_weights_do_not(hf_home):
    out = _in_offline_hub(
        hf_home,
        "model = AutoModelForCausalLM.from_pretrained(REPO_ID)\n"
        "with torch.no_grad():\n"
        "    for p in model.parameters(): p.zero_()\n"
        "print(hellos(model))\n"
        "torch.manual_seed(1)\n"
        "model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(REPO_ID))\n"
        "print(hellos(model))\n"
        "model = AutoModelForCausalLM.from_pretrained(REPO_ID)\n"
        "with torch.no_grad():\n"
        "    model.transformer.ln_f.bias.copy_(model.transformer.ln_f.bias.flip(0))\n"
        "print(hellos(model))\n",
    )
    zeroed, fresh, scrambled = (int(x) for x in out.split())
    assert zeroed == N
    assert fresh == N
    assert scrambled == N


def test_generation_is_deterministic(hf_home, tmp_path):
    # Same seed, same files: a rebuilt stand-in is byte-identical.
    other = tmp_path / "hf"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_standin_model.py"), str(other)],
        check=True,
    )
    snap = lambda home: next((home / "hub").glob("models--*/snapshots/*"))  # noqa: E731
    a, b = snap(hf_home), snap(other)
    assert a.name == b.name
    for f in sorted(p.name for p in a.iterdir()):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
