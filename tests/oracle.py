"""The oracle: transformers' own model run on the full prompt, one question at a time.

For message *m* and question *q*: ``full = preamble + render(prompt, m) + render(question, q)``,
tokenized as one string (``add_special_tokens=True``) by :func:`prompt_tokens`; a choice's tokens
are ``tokenize(full + answer_prefix + label)`` minus the tokens of ``full``; ``logprob`` = sum of
the full-vocabulary log-probabilities of those tokens (the question's ``choice_scoring`` ``mean``:
divided by their number; ``first_token``: the first token's alone).

Special-token text in the message's fields (``<|im_end|>``, ``<end_of_turn>``, ...) is plain text
when the pack says ``special_tokens_in_fields: plain`` (the default): the prompt is cut at the
special tokens written in the pack's own text, and each piece in between is tokenized with
transformers' ``split_special_tokens=True``. With ``parse`` the whole prompt is tokenized with the
tokenizer's defaults.

``prefix_cache=True`` lets transformers reuse ITS OWN key/value cache of shared token prefixes
(see :class:`Oracle`), which keeps the parity suite within CI's time; the tests also run a few
messages of every pack without it (each prompt from its first token).
"""

from __future__ import annotations

import copy
import functools
import math
import string
from collections.abc import Sequence
from typing import Any

import torch


def prompt_tokens(tok: Any, pieces: Sequence[tuple[str, bool]], mode: str) -> list[int]:
    """Token ids of a prompt given as ``(text, from_a_message_field)`` pieces, by the definition
    (module docstring), with the tokenizer's special tokens before the text."""
    text = "".join(t for t, _ in pieces)
    if mode == "parse":
        return tok(text, add_special_tokens=True)["input_ids"]
    assert mode == "plain", mode
    specials, firsts, prefix = _specials(tok)
    runs: list[tuple[str, bool]] = []  # consecutive pieces of the pack's text joined
    for piece, from_field in pieces:
        if runs and not from_field and not runs[-1][1]:
            runs[-1] = (runs[-1][0] + piece, False)
        else:
            runs.append((piece, from_field))
    cuts: list[tuple[int, int, int]] = []  # (start, end, id) of the pack's own special tokens
    at = 0
    for piece, from_field in runs:
        i = 0
        while not from_field and i < len(piece):
            found = [c for c in specials if piece.startswith(c, i)] if piece[i] in firsts else []
            if found:
                longest = max(found, key=len)
                cuts.append((at + i, at + i + len(longest), specials[longest]))
                i += len(longest)
            else:
                i += 1
        at += len(piece)
    ids = list(prefix)
    start = 0
    for a, b, cid in [*cuts, (len(text), len(text), None)]:
        if a > start:
            ids += tok(text[start:a], add_special_tokens=False, split_special_tokens=True)["input_ids"]
        if cid is not None:
            ids.append(cid)
        start = b
    return ids


@functools.cache
def _specials(tok: Any) -> tuple[dict[str, int], frozenset[str], tuple[int, ...]]:
    """The tokenizer's special tokens (text -> id), their first characters, and the tokens it
    puts before a text (e.g. ``<bos>``)."""
    specials = {t.content: i for i, t in tok.added_tokens_decoder.items() if t.special}
    bare = tok("x", add_special_tokens=False)["input_ids"]
    prefix = tuple(tok("x", add_special_tokens=True)["input_ids"][: -len(bare)])
    return specials, frozenset(c[0] for c in specials), prefix


def prompt_pieces(pack: Any, fields: dict[str, str]) -> list[tuple[str, bool]]:
    """``preamble + render(prompt, fields)`` as ``(text, from_a_message_field)`` pieces."""
    pieces = [(pack.preamble, False)]
    for literal, name, _, _ in string.Formatter().parse(pack.prompt):
        pieces.append((literal, False))
        if name is not None:
            pieces.append((fields[name], True))
    return pieces


class Oracle:
    """transformers' model scoring a pack's questions one at a time.

    With ``prefix_cache`` (default), transformers reuses its own key/value cache of token
    prefixes that prompts share (the preamble, a message's content, a question's prompt before
    its choices) — prefix caching, as any server does — and runs only the rest of each prompt.
    Every prompt is still tokenized whole and checked to start with the cached prefix.
    """

    def __init__(
        self, model: Any, tokenizer: Any, pack: Any, *, prefix_cache: bool = True,
        special_tokens_in_fields: str | None = None,
    ) -> None:
        self.tok = tokenizer
        self.model = model
        self.pack = pack
        self.mode = special_tokens_in_fields or pack.special_tokens_in_fields
        self.prefix_cache = prefix_cache
        self.caches: dict[tuple[int, ...], Any] = {}
        self.preamble_key: tuple[int, ...] = ()
        if prefix_cache and pack.preamble:
            ids = prompt_tokens(self.tok, [(pack.preamble, False)], self.mode)
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
        """``{question id: {label: logprob}}`` for one message, its fields read as the pack reads
        them (normalized, then escaped). A question the pack's ``views`` decide takes the numbers
        of the read, the whole message's or a view's, whose first choice leads most (the first on
        ties): the definition, each read scored on its own."""
        from spinf_stream.engine.views import views_of

        out = self._read(fields, self.pack.expand())
        spec = self.pack.views
        if spec is None:
            return out
        decided = [q for q in self.pack.expand() if q.id in spec.questions]
        for v in views_of(fields[spec.field], spec.prefixes, spec.suffixes):  # views of the text as given
            seen = self._read({**fields, spec.field: v.text}, decided)
            for q in decided:
                first, second = q.choices[0], q.choices[1]
                if seen[q.id][first] - seen[q.id][second] > out[q.id][first] - out[q.id][second]:
                    out[q.id] = seen[q.id]
        return out

    def _read(self, fields: dict[str, str], questions: Sequence[Any]) -> dict[str, dict[str, float]]:
        """The questions' logprobs for fields as given, each pack field normalized then escaped."""
        from spinf_stream.packs.normalize import normalize

        fields = {k: self.pack.escape_field(normalize(v, self.pack.normalize_fields)) if k in self.pack.fields else v
                  for k, v in fields.items()}
        return self._score(fields, questions)

    def _score(self, fields: dict[str, str], questions: Sequence[Any]) -> dict[str, dict[str, float]]:
        head = prompt_pieces(self.pack, fields)
        texts = [[*head, (self.pack.render_question(q), False)] for q in questions]
        fulls = [prompt_tokens(self.tok, t, self.mode) for t in texts]
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
                c_ids = prompt_tokens(self.tok, [*full, (self.pack.answer_prefix + label, False)], self.mode)
                assert c_ids[: len(f_ids)] == f_ids, "choice tokens do not extend the prompt's"
                conts.append(c_ids[len(f_ids) :])
            first, _ = self._run(f_ids, 1)
            lps: dict[str, float] = {}
            if self.prefix_cache and any(len(c) > 1 for c in conts):
                self._remember(f_ids[:-1])
            for label, c in zip(q.choices, conts):
                if len(c) == 1 or q.choice_scoring == "first_token":
                    lps[label] = float(first[0, c[0]])
                else:
                    lp, _ = self._run(f_ids + c[:-1], len(c))
                    lps[label] = math.fsum(float(lp[i, t]) for i, t in enumerate(c))
                    if q.choice_scoring == "mean":
                        lps[label] /= len(c)
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


def next_logprobs(model: Any, ids: list[int]) -> torch.Tensor:
    """``[len(ids), V]`` float64 log-softmax of transformers' logits at every position."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)


def greedy_writing(model: Any, ids: list[int], n: int, eos: int | None) -> tuple[list[int], list[float]]:
    """transformers' greedy writing (``generate(do_sample=False)``, no cache), one token at a time:
    the ids written before ``eos`` (at most ``n``) and each one's full-vocabulary logprob."""
    out: list[int] = []
    lps: list[float] = []
    for _ in range(n):
        lp = next_logprobs(model, ids + out)[-1]
        t = int(torch.argmax(lp))
        if t == eos:
            break
        out.append(t)
        lps.append(float(lp[t]))
    return out, lps
