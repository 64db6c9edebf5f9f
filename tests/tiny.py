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


#: Gemma 3's image markers as the tokenizer's named special tokens (what ``Gemma3Processor`` reads)
IMAGE_MARKERS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
#: the tiny multimodal model's picture side and soft tokens per picture
VL_IMAGE_SIZE = 20
VL_TOKENS_PER_IMAGE = 4


def build_tiny_gemma3_vl(out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Save a random-weight ``Gemma3ForConditionalGeneration`` (SigLIP tower of 2 layers, 20-pixel
    pictures in 5-pixel patches, 4 soft tokens a picture; a 3-layer text model with a sliding
    window of 3, shorter than a picture) with the Gemma 3 tokenizer of ``tokenizer_dir`` plus its
    image soft token, as Gemma 3's multimodal checkpoints ship it (``<image_soft_token>`` after
    the vocabulary)."""
    from transformers import AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), extra_special_tokens=IMAGE_MARKERS)
    torch.manual_seed(seed)
    config = Gemma3Config(
        text_config={"vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 3,
                     "query_pre_attn_scalar": 16, "max_position_embeddings": 512, "final_logit_softcapping": 30.0,
                     "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]},
        vision_config={"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "image_size": VL_IMAGE_SIZE, "patch_size": 5, "layer_norm_eps": 1e-6},
        mm_tokens_per_image=VL_TOKENS_PER_IMAGE, image_token_index=tok.image_token_id,
        boi_token_index=tok.boi_token_id, eoi_token_index=tok.eoi_token_id,
    )
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # every tensor random (norms and the projector start at constants)
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.1 if p.ndim == 1 else 0.08))
        model.model.multi_modal_projector.mm_input_projection_weight.normal_()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


#: Idefics3's (SmolVLM's) image tokens: the special ones its processor adds, then the grid tags
IDEFICS3_SPECIAL = ["<fake_token_around_image>", "<image>", "<end_of_utterance>"]
IDEFICS3_TAGS = ["<global-img>"] + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]


def build_tiny_idefics3(out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Save a random-weight ``Idefics3ForConditionalGeneration`` (SmolVLM's architecture: a SigLIP
    tower of 2 layers on 20-pixel tiles in 5-pixel patches, a pixel shuffle by 2 to 4 soft tokens
    a tile, a 2-layer Llama) with the SmolLM2 tokenizer of ``tokenizer_dir`` plus Idefics3's image
    tokens, and its processor's settings (pictures resized to 40 pixels on the longest edge, cut
    into 20-pixel tiles)."""
    from transformers import AutoTokenizer, Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.add_special_tokens({"additional_special_tokens": IDEFICS3_SPECIAL})
    tok.add_tokens(IDEFICS3_TAGS)
    torch.manual_seed(seed)
    config = Idefics3Config(
        text_config={"model_type": "llama", "vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False},
        vision_config={"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "image_size": 20, "patch_size": 5},
        scale_factor=2, image_token_id=tok.convert_tokens_to_ids("<image>"),
    )
    model = Idefics3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.1 + (1.0 if p.ndim == 1 and "norm" in name else 0.0) if p.ndim == 1
                    else torch.randn_like(p) * 0.08)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(size={"longest_edge": 40}, max_image_size={"longest_edge": 20}),
        tokenizer=tok, image_seq_len=4)
    processor.save_pretrained(str(out))
    return out
