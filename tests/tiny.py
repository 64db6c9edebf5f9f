"""Tiny random-weight models of each family, built from small transformers configs and saved as
Hugging Face directories next to a real tokenizer (taken from a real model's cached conversion).

The configs are small but keep each family's distinguishing features switched on (GQA, q/k
norms, biases, sliding windows shorter than the prompts, Gemma's local/global layers).
"""

from __future__ import annotations

from pathlib import Path

import torch

#: a pack with a question of every kind: choice, number, money, text and generate (pack YAML)
EXTRACTION_PACK = """\
name: extracting
version: "1.0.0"
description: choice, number, money, text and generate questions of one message
preamble: "Read the message and answer.\\n\\n"
prompt: "Message: {text}\\n"
question: "Question: {question}\\nAnswer:"
choices: [yes, no]
questions:
  - id: spam
    text: Is this message spam?
  - id: count
    text: How many items does it mention?
    extract: number
    max_tokens: 6
  - id: amount
    text: What amount of money does it ask for?
    extract: money
    max_tokens: 8
  - id: who
    text: Who wrote it?
    extract: text
    max_tokens: 5
  - id: gist
    text: What is it about?
    generate: {max_tokens: 4}
"""

#: family -> real model whose tokenizer the tiny model uses
TOKENIZER_OF = {
    "llama": "smollm2-135m",
    "mistral": "smollm2-135m",
    "qwen2": "smollm2-135m",
    "qwen3": "smollm2-135m",
    "gemma3": "gemma-3-270m",
}
FAMILIES = tuple(TOKENIZER_OF)


def tiny_config(family: str, vocab_size: int, bos: int | None, eos: int | None):
    """A small transformers config of ``family`` (2–3 layers, hidden 64)."""
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=bos, eos_token_id=eos,
        pad_token_id=eos, rms_norm_eps=1e-6,
    )
    if family == "llama":
        return LlamaConfig(num_hidden_layers=2, tie_word_embeddings=True, rope_theta=10000.0, **common)
    if family == "mistral":
        # window shorter than the test prompts, so the window is exercised
        return MistralConfig(num_hidden_layers=2, sliding_window=24, tie_word_embeddings=False, head_dim=16, **common)
    if family == "qwen2":
        return Qwen2Config(num_hidden_layers=2, tie_word_embeddings=True, **common)
    if family == "qwen3":
        return Qwen3Config(num_hidden_layers=2, head_dim=16, tie_word_embeddings=True, **common)
    if family == "gemma3":
        return Gemma3TextConfig(
            num_hidden_layers=3, head_dim=16, sliding_window=16, query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            final_logit_softcapping=30.0, attn_logit_softcapping=50.0, **common,
        )
    raise ValueError(family)


def build_tiny(family: str, out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Save a random-weight ``family`` model with the tokenizer of ``tokenizer_dir`` to ``out``.

    Every parameter (norm scales and biases too) is randomised, so a bug in any of them shows.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    cfg = tiny_config(family, len(tok), tok.bos_token_id, tok.eos_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.randn_like(p) * 0.1 + (0.0 if family == "gemma3" else 1.0) * ("norm" in name))
            else:
                p.copy_(torch.randn_like(p) * 0.08)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out
