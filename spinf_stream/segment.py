"""Tokenizing a message for one pack: shared content plus one branch per question.

Tokenization follows the score's definition: the prompt of message *m* and question *q* is
``preamble + render(prompt, m) + render(question, q)`` tokenized as ONE string with the
tokenizer's defaults. We never tokenize the pieces separately and glue them (BPE merges and
pre-tokenizer look-ahead cross the seams); instead we tokenize the whole string once, cut it at a
token boundary, re-tokenize only the tail from that boundary for the other questions, and verify
the cut reproduces the whole-string tokens (falling back to whole-string tokenization per question
when it does not).

Planning forward passes from the tokenized messages is :mod:`spinf_stream.layout`'s job.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the pack is only read through its methods; keeps this module free of pydantic
    from .packs import Pack


class LayoutError(ValueError):
    """A message that cannot be laid out; ``kind`` is the machine-readable reason."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Branch:
    """One question's branch of one message: the tokens fed after the content.

    ``tokens`` are the question's own tokens (question text + answer cue) followed by the inner
    nodes of the choices' token trie (every proper prefix of a multi-token choice, shared
    prefixes once). ``parents[i]`` is the index of token i's parent in this branch (-1: the
    content's last token); ``depths[i]`` its logical offset after the content (0 = first branch
    token). ``reads`` are the branch indices whose next-token log-probabilities are read;
    ``choices[j]`` is choice j's path as ``(read_index, token_id)`` pairs: its logprob is the sum
    of ``logprob(token_id | row reads[read_index])``.
    """

    question: int
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    reads: tuple[int, ...]
    choices: tuple[tuple[tuple[int, int], ...], ...]

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class PreparedMessage:
    """A tokenized message, ready to be packed.

    ``content`` are the tokens after the pack's preamble cache (``prefix_len`` tokens, the
    cached preamble, when ``use_preamble``; else the content holds the whole prompt from token 0).
    Content positions are ``prefix_len .. prefix_len + len(content) - 1``.
    """

    index: int
    id: str
    content: tuple[int, ...]
    use_preamble: bool
    prefix_len: int
    branches: tuple[Branch, ...]

    @property
    def n_tokens(self) -> int:
        """Tokens this message adds to forward passes (content once + every branch)."""
        return len(self.content) + sum(len(b) for b in self.branches)


def _common_prefix_len(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _build_branch(question: int, branch: list[int], choice_tokens: list[list[int]]) -> Branch:
    """Branch tokens as a chain, then a trie of the choices' tokens (leaves are never fed)."""
    tokens = list(branch)
    parents = [i - 1 for i in range(len(branch))]
    depths = list(range(len(branch)))
    last = len(branch) - 1
    reads = [last]
    read_of_node = {(): 0}  # trie prefix -> index into reads
    node_of_prefix: dict[tuple[int, ...], int] = {(): last}
    paths = []
    for toks in choice_tokens:
        path = []
        for i, t in enumerate(toks):
            prefix = tuple(toks[:i])
            if prefix not in read_of_node:
                parent = node_of_prefix[prefix[:-1]]
                tokens.append(prefix[-1])
                parents.append(parent)
                depths.append(depths[parent] + 1)
                node_of_prefix[prefix] = len(tokens) - 1
                read_of_node[prefix] = len(reads)
                reads.append(len(tokens) - 1)
            path.append((read_of_node[prefix], t))
        paths.append(tuple(path))
    return Branch(question, tuple(tokens), tuple(parents), tuple(depths), tuple(reads), tuple(paths))


class Segmenter:
    """Tokenizes messages for one pack and one tokenizer.

    Args:
        tokenizer: a transformers fast tokenizer (offsets mapping needed).
        pack: the validated pack.
        max_positions: the model's context (tokens); longer prompts are rejected.

    Raises:
        LayoutError: (kind ``choice_tokenization``) a choice whose tokens do not extend its
            question's tokens, so ``logprob`` would be ill-defined.
    """

    def __init__(self, tokenizer: Any, pack: Pack, max_positions: int) -> None:
        self.tok = tokenizer
        self.pack = pack
        self.max_positions = max_positions
        self.questions = pack.expand()
        self.q_texts = [pack.render_question(q) for q in self.questions]
        self.suffixes = [[pack.answer_prefix + c for c in q.choices] for q in self.questions]
        # Characters shared by every rendered question: text the content's last tokens see.
        cpl = len(self.q_texts[0])
        for t in self.q_texts[1:]:
            cpl = min(cpl, _common_prefix_len(self.q_texts[0], t))
        self.shared_question_chars = cpl
        self._check_choices()
        self.preamble_ids, self.preamble_chars = self._preamble_cut()

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return self.tok(texts, add_special_tokens=False)["input_ids"]

    def _check_choices(self) -> None:
        for q, text, sufs in zip(self.questions, self.q_texts, self.suffixes):
            base, *alts = self._encode([text] + [text + s for s in sufs])
            for label, ids in zip(q.choices, alts):
                if ids[: len(base)] != base or len(ids) == len(base):
                    raise LayoutError(
                        "choice_tokenization",
                        f"pack {self.pack.name!r}: choice {label!r} of question {q.id!r} merges with the "
                        f"question's last token; end the question template differently or change answer_prefix",
                    )

    def _preamble_cut(self) -> tuple[list[int], int]:
        """Tokens of the preamble that every message shares, and the char where the rest starts.

        The last preamble token is left to the message (it can merge with what follows);
        each message checks that its own tokens start with these.
        """
        pre = self.pack.preamble
        literal = next(iter(string.Formatter().parse(self.pack.prompt)), ("",))[0]
        enc = self.tok(pre + literal, add_special_tokens=True, return_offsets_mapping=True)
        ids, offs = enc["input_ids"], enc["offset_mapping"]
        n_special = 0
        while n_special < len(ids) and offs[n_special] == (0, 0) and ids[n_special] in self.tok.all_special_ids:
            n_special += 1
        inside = sum(1 for i in range(n_special, len(ids)) if offs[i][1] <= len(pre) and offs[i][1] > 0)
        cut = n_special + max(0, inside - 1)
        chars = offs[cut][0] if cut < len(ids) else len(pre)
        return list(ids[:cut]), chars

    def prepare(self, index: int, msg_id: str, fields: dict[str, str]) -> PreparedMessage:
        """Tokenize one message (fields already validated as non-empty strings).

        Raises:
            LayoutError: ``too_long`` when the prompt exceeds the model's context.
        """
        head = self.pack.preamble + self.pack.render_prompt(fields)
        full0 = head + self.q_texts[0]
        enc = self.tok(full0, add_special_tokens=True, return_offsets_mapping=True)
        ids: list[int] = enc["input_ids"]
        offs = enc["offset_mapping"]
        p = len(self.preamble_ids)
        use_preamble = ids[:p] == self.preamble_ids and (p == len(ids) or offs[p][0] >= self.preamble_chars)
        prefix_len = p if use_preamble else 0
        # Content = tokens wholly inside head; the branch starts at the next token's first char.
        cut = prefix_len
        while cut < len(ids) and (offs[cut][1] <= len(head) or offs[cut] == (0, 0)):
            cut += 1
        char0 = offs[cut][0] if cut < len(ids) else len(head)
        tails = [head[char0:] + t for t in self.q_texts]
        tail_ids = self._encode(tails)
        exact = tail_ids[0] == ids[cut:] and cut > prefix_len and self.shared_question_chars >= 4
        content = ids[prefix_len:cut]
        if exact:
            branches_tok = tail_ids
        else:
            content, branches_tok = self._whole_string_split(head, ids, prefix_len)
        choice_ids = self._encode([tails[k] + s for k in range(len(tails)) for s in self.suffixes[k]])
        if not exact:
            fulls = [head + t + s for t, sufs in zip(self.q_texts, self.suffixes) for s in sufs]
            choice_full = self.tok(fulls, add_special_tokens=True)["input_ids"]
            choice_ids = [c[prefix_len + len(content) :] for c in choice_full]
        branches = []
        j = 0
        longest = 0
        for k, br in enumerate(branches_tok):
            ctoks = []
            for label in self.questions[k].choices:
                c = choice_ids[j]
                j += 1
                if c[: len(br)] != br or len(c) == len(br):
                    raise LayoutError(
                        "choice_tokenization",
                        f"choice {label!r} of question {self.questions[k].id!r} does not extend the prompt's tokens",
                    )
                ctoks.append(c[len(br) :])
            b = _build_branch(k, br, ctoks)
            longest = max(longest, max(b.depths) + 1)
            branches.append(b)
        total = prefix_len + len(content) + longest
        if total > self.max_positions:
            raise LayoutError(
                "too_long",
                f"prompt needs {total} positions (content {len(content) + prefix_len} + longest branch "
                f"{longest}); the model's context is {self.max_positions} tokens",
            )
        return PreparedMessage(index, msg_id, tuple(content), use_preamble, prefix_len, tuple(branches))

    def _whole_string_split(self, head: str, ids0: list[int], prefix_len: int) -> tuple[list[int], list[list[int]]]:
        """Slow exact path: tokenize every question's whole prompt; content = common prefix."""
        fulls = self.tok([head + t for t in self.q_texts], add_special_tokens=True)["input_ids"]
        common = len(fulls[0])
        for f in fulls[1:]:
            common = min(common, _common_prefix_len(fulls[0], f))
        # Keep at least one token per branch so every question has a row to read.
        common = min(common, min(len(f) for f in fulls) - 1)
        common = max(common, prefix_len)
        return list(fulls[0][prefix_len:common]), [list(f[common:]) for f in fulls]
