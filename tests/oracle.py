"""The oracle: transformers' own model run on the full prompt, one question at a time.

For message *m* and question *q*: ``full = preamble + render(prompt, m) + render(question, q)``,
tokenized as one string (``add_special_tokens=True``); a choice's tokens are
``tokenize(full + answer_prefix + label)`` minus the tokens of ``full``; ``logprob`` = sum of the
full-vocabulary log-probabilities of those tokens.

``prefix_cache=True`` lets transformers reuse ITS OWN key/value cache of the tokens every prompt
of the pack starts with (the preamble) — the prefix-caching any server does — which keeps the
parity suite within CI's time; the tests also run a few messages without it.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch


class Oracle:
    def __init__(self, model: Any, tokenizer: Any, pack: Any, *, prefix_cache: bool = True) -> None:
        self.tok = tokenizer
        self.model = model
        self.pack = pack
        self.prefix_ids: list[int] = []
        self.cache = None
        if prefix_cache and pack.preamble:
            # tokens of the preamble that survive in every full prompt (checked per prompt below)
            ids = self.tok(pack.preamble, add_special_tokens=True)["input_ids"]
            self.prefix_ids = ids[:-1]
            with torch.no_grad():
                self.cache = self.model(torch.tensor([self.prefix_ids]), use_cache=True).past_key_values

    @torch.no_grad()
    def _logits(self, ids: list[int], keep: int) -> torch.Tensor:
        """log-softmax of the last ``keep`` positions' logits, ``[keep, vocab]`` fp32."""
        p = len(self.prefix_ids)
        if self.cache is not None and ids[:p] == self.prefix_ids and len(ids) - p >= keep:
            out = self.model(
                torch.tensor([ids[p:]]), past_key_values=copy.deepcopy(self.cache), use_cache=True, logits_to_keep=keep
            )
        else:
            out = self.model(torch.tensor([ids]), logits_to_keep=keep)
        return out.logits[0].float().log_softmax(-1)

    def score(self, fields: dict[str, str]) -> dict[str, dict[str, float]]:
        """``{question id: {label: logprob}}`` for one message."""
        head = self.pack.preamble + self.pack.render_prompt(fields)
        out: dict[str, dict[str, float]] = {}
        for q in self.pack.expand():
            full = head + self.pack.render_question(q)
            f_ids = self.tok(full, add_special_tokens=True)["input_ids"]
            conts = []
            for label in q.choices:
                c_ids = self.tok(full + self.pack.answer_prefix + label, add_special_tokens=True)["input_ids"]
                assert c_ids[: len(f_ids)] == f_ids, "choice tokens do not extend the prompt's"
                conts.append(c_ids[len(f_ids) :])
            lps: dict[str, float] = {}
            if all(len(c) == 1 for c in conts):
                lp = self._logits(f_ids, 1)[0]
                for label, c in zip(q.choices, conts):
                    lps[label] = float(lp[c[0]])
            else:
                for label, c in zip(q.choices, conts):
                    lp = self._logits(f_ids + c, len(c) + 1)
                    lps[label] = math.fsum(float(lp[i, t]) for i, t in enumerate(c))
            out[q.id] = lps
        return out


def probabilities(logprobs: dict[str, float]) -> dict[str, float]:
    """Softmax over a question's choices (float64)."""
    top = max(logprobs.values())
    e = {k: math.exp(v - top) for k, v in logprobs.items()}
    s = math.fsum(e.values())
    return {k: v / s for k, v in e.items()}


def load_hf(model_dir: str) -> Any:
    """transformers' own implementation of the checkpoint, fp32, eager attention."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    return model.eval()
