"""The oracle: transformers' own model run on the full prompt, one question at a time.

For message *m* and question *q*: ``full = preamble + render(prompt, m) + render(question, q)``,
tokenized as one string (``add_special_tokens=True``); a choice's tokens are
``tokenize(full + answer_prefix + label)`` minus the tokens of ``full``; ``logprob`` = sum of the
full-vocabulary log-probabilities of those tokens.

``prefix_cache=True`` lets transformers reuse ITS OWN key/value cache of shared token prefixes
(see :class:`Oracle`), which keeps the parity suite within CI's time; the tests also run a few
messages of every pack without it (each prompt from its first token).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch


class Oracle:
    """transformers' model scoring a pack's questions one at a time.

    With ``prefix_cache`` (default), transformers reuses its own key/value cache of token
    prefixes that prompts share (the preamble, a message's content, a question's prompt before
    its choices) — prefix caching, as any server does — and runs only the rest of each prompt.
    Every prompt is still tokenized whole and checked to start with the cached prefix.
    """

    def __init__(self, model: Any, tokenizer: Any, pack: Any, *, prefix_cache: bool = True) -> None:
        self.tok = tokenizer
        self.model = model
        self.pack = pack
        self.prefix_cache = prefix_cache
        self.caches: dict[tuple[int, ...], Any] = {}
        self.preamble_key: tuple[int, ...] = ()
        if prefix_cache and pack.preamble:
            ids = self.tok(pack.preamble, add_special_tokens=True)["input_ids"]
            self.preamble_key = self._remember(ids[:-1])

    def _best_prefix(self, ids: list[int], feed_at_least: int) -> tuple[int, ...]:
        best: tuple[int, ...] = ()
        for key in self.caches:
            if len(best) < len(key) <= len(ids) - feed_at_least and tuple(ids[: len(key)]) == key:
                best = key
        return best

    @torch.no_grad()
    def _run(self, ids: list[int], keep: int) -> tuple[torch.Tensor, Any]:
        """Logits of the last ``keep`` positions of ``ids`` and the cache after ``ids``."""
        key = self._best_prefix(ids, max(keep, 1)) if self.prefix_cache else ()
        cache = copy.deepcopy(self.caches[key]) if key else None
        out = self.model(torch.tensor([ids[len(key) :]]), past_key_values=cache, use_cache=self.prefix_cache, logits_to_keep=keep)
        return out.logits[0].float().log_softmax(-1), out.past_key_values

    def _remember(self, ids: list[int]) -> tuple[int, ...]:
        key = tuple(ids)
        if key and key not in self.caches:
            _, self.caches[key] = self._run(list(ids), 1)
        return key

    def score(self, fields: dict[str, str]) -> dict[str, dict[str, float]]:
        """``{question id: {label: logprob}}`` for one message."""
        head = self.pack.preamble + self.pack.render_prompt(fields)
        questions = self.pack.expand()
        texts = [head + self.pack.render_question(q) for q in questions]
        fulls = [self.tok(t, add_special_tokens=True)["input_ids"] for t in texts]
        if self.prefix_cache:  # one message's caches at a time, beside the preamble's
            self.caches = {k: v for k, v in self.caches.items() if k == self.preamble_key}
            shared = min(len(f) for f in fulls) - 1
            for f in fulls[1:]:
                shared = min(shared, next((i for i, (a, b) in enumerate(zip(fulls[0], f)) if a != b), shared))
            if shared > len(self.preamble_key):
                self._remember(fulls[0][:shared])
        out: dict[str, dict[str, float]] = {}
        for q, full, f_ids in zip(questions, texts, fulls):
            conts = []
            for label in q.choices:
                c_ids = self.tok(full + self.pack.answer_prefix + label, add_special_tokens=True)["input_ids"]
                assert c_ids[: len(f_ids)] == f_ids, "choice tokens do not extend the prompt's"
                conts.append(c_ids[len(f_ids) :])
            first, _ = self._run(f_ids, 1)
            lps: dict[str, float] = {}
            if self.prefix_cache and any(len(c) > 1 for c in conts):
                self._remember(f_ids[:-1])
            for label, c in zip(q.choices, conts):
                if len(c) == 1:
                    lps[label] = float(first[0, c[0]])
                else:
                    lp, _ = self._run(f_ids + c[:-1], len(c))
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
