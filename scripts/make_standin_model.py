#!/usr/bin/env python3
"""Builds an offline stand-in for the hub repository "EleutherAI/gpt-neo-125M".

Upstream tensorizer's test suite loads that model and its tokenizer with
`from_pretrained("EleutherAI/gpt-neo-125M")`. Nothing is downloaded here: this
writes a *tiny* GPT-Neo (same architecture and tensor names, far fewer layers
and a small vocabulary, fast on CPU) and a GPT-2 style byte-level BPE
tokenizer, both made locally from a fixed seed, into a Hugging Face hub cache
layout:

    <hf_home>/hub/models--EleutherAI--gpt-neo-125M/refs/main
    <hf_home>/hub/models--EleutherAI--gpt-neo-125M/snapshots/<rev>/...

so that with HF_HOME=<hf_home> and HF_HUB_OFFLINE=1 the suite finds it.

The weights are chosen so that a *correct* load makes `generate()` always
sample " hello" (what the suite's check_inference asks for): the final layer
norm has a zero gain and a bias equal to a large multiple of the " hello"
token embedding, and the output head is tied to the token embeddings, so the
logit of " hello" exceeds every other logit by a wide margin. A zeroed,
uninitialised or scrambled load of these tensors does not.

Usage: make_standin_model.py HF_HOME [--check]
Idempotent: a complete stand-in made by the same script version is kept.
"""

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

REPO_ID = "EleutherAI/gpt-neo-125M"
SEED = 20250125
# Bumped whenever the generated content changes; part of the snapshot name.
GENERATOR_VERSION = 1

HIDDEN = 768  # as the real model: the suite builds a LayerNorm(768) to swap in
LAYERS = 2
HEADS = 12
# Enough parameters for the suite's size checks (torch_compat expects an fp16
# save above 20 MiB), few enough layers to be fast on CPU.
INTERMEDIATE = 3072
MAX_POSITIONS = 2048  # as the real model; torch_compat's forward pass needs > 1000
VOCAB_TARGET = 1024
EOS = "<|endoftext|>"
HELLO_LOGIT_SCALE = 50.0


def _revision() -> str:
    h = hashlib.sha1(f"tz-standin-{REPO_ID}-{SEED}-{GENERATOR_VERSION}".encode())
    return h.hexdigest()


def _corpus(rng: random.Random):
    # Seeded pseudo-words (no "hello" among them) plus the one phrase the
    # suite uses, so that " hello" becomes a single token as in GPT-2's vocab.
    letters = "abcdefgijkmnpqrstuvwxyz"  # no 'h', 'l', 'o': keeps "hello" out
    for _ in range(4000):
        words = [
            "".join(rng.choice(letters) for _ in range(rng.randint(2, 7)))
            for _ in range(rng.randint(3, 12))
        ]
        yield " ".join(words)
    for _ in range(200):
        yield " hello" * 8


def build_tokenizer(rng: random.Random, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers import trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(_corpus(rng)), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    # The slow-tokenizer files too, as the real repository has them.
    data = json.loads((out / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    merges = data["model"]["merges"]
    lines = ["#version: 0.2"] + [
        m if isinstance(m, str) else " ".join(m) for m in merges
    ]
    (out / "merges.txt").write_text("\n".join(lines) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": EOS, "eos_token": EOS, "unk_token": EOS})
    )
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "GPT2Tokenizer",
                "add_prefix_space": False,
                "bos_token": EOS,
                "eos_token": EOS,
                "unk_token": EOS,
                "model_max_length": MAX_POSITIONS,
            }
        )
    )
    return tok.get_vocab_size(), tok.token_to_id(EOS), tok.encode(" hello").ids


def build_model(out: Path, vocab_size: int, eos_id: int, hello_id: int):
    import torch
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    config = GPTNeoConfig(
        vocab_size=vocab_size,
        max_position_embeddings=MAX_POSITIONS,
        hidden_size=HIDDEN,
        num_layers=LAYERS,
        attention_types=[[["global", "local"], LAYERS // 2]],
        num_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        window_size=256,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(SEED)
    model = GPTNeoForCausalLM(config)
    model.eval()
    with torch.no_grad():
        g = torch.Generator().manual_seed(SEED)
        # Every tensor gets seeded values unlike a fresh initialisation (layer
        # norms not all ones, biases not all zeros), so that a tensor left
        # at its default, zeroed or swapped is detectable.
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g)
            if ".ln_" in name or name.startswith("transformer.ln_"):
                p.copy_(1.0 + 0.1 * noise if name.endswith("weight") else 0.05 * noise)
            elif name.endswith("bias"):
                p.copy_(0.01 * noise)
            else:
                p.copy_(0.02 * noise)
        wte = model.transformer.wte.weight
        direction = torch.randn(HIDDEN, generator=g)
        direction /= direction.norm()
        wte[hello_id] = direction
        ln_f = model.transformer.ln_f
        ln_f.weight.zero_()
        ln_f.bias.copy_(direction * HELLO_LOGIT_SCALE)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)


def check(snapshot: Path) -> bool:
    """True when generation from the stand-in gives " hello" every time."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(snapshot)
    model = AutoModelForCausalLM.from_pretrained(snapshot)
    ids = tok.encode(" hello" * 8, return_tensors="pt")
    torch.manual_seed(0)
    with torch.no_grad():
        outp = model.generate(
            ids, max_new_tokens=10, do_sample=True, pad_token_id=tok.eos_token_id
        )
    text = tok.decode(outp[0], skip_special_tokens=True)
    return text.count("hello") == 18


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_home", type=Path)
    ap.add_argument("--check", action="store_true", help="also test generation")
    args = ap.parse_args()

    repo_dir = args.hf_home / "hub" / ("models--" + REPO_ID.replace("/", "--"))
    rev = _revision()
    snapshot = repo_dir / "snapshots" / rev
    stamp = snapshot / ".tz-standin-complete"
    if not stamp.exists():
        rng = random.Random(SEED)
        args.hf_home.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".standin-", dir=args.hf_home))
        try:
            vocab_size, eos_id, hello_ids = build_tokenizer(rng, tmp)
            if len(hello_ids) != 1:
                raise SystemExit(f"' hello' is not one token: {hello_ids}")
            build_model(tmp, vocab_size, eos_id, hello_ids[0])
            (tmp / ".tz-standin-complete").write_text(f"{GENERATOR_VERSION}\n")
            if snapshot.exists():
                shutil.rmtree(snapshot)
            snapshot.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, snapshot)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(rev)
    print(f"stand-in for {REPO_ID}: {snapshot}")
    if args.check and not check(snapshot):
        print("stand-in does not generate ' hello'", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
