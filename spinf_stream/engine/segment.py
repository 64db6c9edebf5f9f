"""Tokenizing a message for one pack: shared content plus one branch per question.

Tokenization follows the score's definition: the prompt of message *m* and question *q* is
``preamble + render(prompt, m) + render(question, q)``, tokenized as ONE string
(:mod:`spinf_stream.engine.tokenizer` says how special-token text in the message's fields is read). We
never tokenize pieces separately and glue them (BPE merges and pre-tokenizer look-ahead cross the
seams). Instead each question's prompt is tokenized as question 0's tokens up to a *seam* — a place
where the tokenizer's output provably splits (:mod:`spinf_stream.engine.seams`) and which both prompts
share — followed by the tokens of the rest of its own prompt alone. A question with no such seam
is tokenized whole. The content is then the tokens every question's prompt starts with.

Planning forward passes from the tokenized messages is :mod:`spinf_stream.engine.layout`'s job.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from spinf_stream.engine.tokenizer import Prompt, PromptTokenizer, SpecialTokensInFields
from spinf_stream.engine.views import views_of

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # the pack is only read through its methods; keeps this module free of pydantic
    from spinf_stream.packs import Pack


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


@dataclass(frozen=True, eq=False)
class ImageSlot:
    """One picture tile of a message: its soft-token rows ``content[start : start + length]``,
    whose embeddings the model's image reader replaces (``image``: the tile's pixel values
    ``[3, S, S]`` float32), attending to each other both ways when ``bidirectional`` (a block of
    the mask; Gemma 3), else causally."""

    start: int
    length: int
    image: Any
    bidirectional: bool = True


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
    #: the most rows its decode steps can feed: over its extraction questions, ``max_tokens - 1``
    decode_tokens: int = 0
    #: the pack's views of it (:mod:`spinf_stream.engine.views`): each a message of its own, with
    #: the branches of the questions views decide only; ``view`` names a view (``""``: the message)
    views: tuple[PreparedMessage, ...] = ()
    view: str = ""
    #: its pictures, in prompt order (content indices; none for a text message)
    images: tuple[ImageSlot, ...] = ()

    @property
    def n_tokens(self) -> int:
        """Tokens this message adds to forward passes (content once + every branch; its views
        are laid out as messages of their own)."""
        return len(self.content) + sum(len(b) for b in self.branches)

    @property
    def cost_tokens(self) -> int:
        """What a batch's token budget counts for it: :attr:`n_tokens` (its prefill) plus
        :attr:`decode_tokens` (its decode steps, at most), and its views' costs."""
        return self.n_tokens + self.decode_tokens + sum(v.cost_tokens for v in self.views)


def _common_prefix_len(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Length of the longest common prefix (slice comparisons run in C: fast on long lists)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # invariant: a[:lo] == b[:lo]; the answer is in [lo, hi]
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _extends(base: Sequence[int], ids: Sequence[int]) -> bool:
    """Whether a choice's tokens ``ids`` (of prompt + answer prefix + label) are the prompt's tokens
    ``base`` followed by at least one token: else the choice merges with the prompt's last token
    and its logprob is ill-defined."""
    return ids[: len(base)] == base and len(ids) != len(base)


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


@dataclass(frozen=True)
class _Split:
    """A question's whole-prompt tokens, written as ``first[:shared] + rest`` where ``first`` is
    question 0's whole-prompt tokens."""

    shared: int
    rest: list[int]

    @property
    def n_tokens(self) -> int:
        return self.shared + len(self.rest)

    def token(self, first: list[int], i: int) -> int:
        return first[i] if i < self.shared else self.rest[i - self.shared]

    def tokens_from(self, first: list[int], start: int) -> list[int]:
        return first[start : self.shared] + self.rest[max(start - self.shared, 0) :]


class Segmenter:
    """Tokenizes messages for one pack and one tokenizer.

    Args:
        tokenizer: a transformers fast tokenizer, or a :class:`~spinf_stream.engine.tokenizer.PromptTokenizer`
            to share its copy of one.
        pack: the validated pack.
        max_positions: the model's context (tokens); longer prompts are rejected.
        special_tokens_in_fields: ``"plain"`` or ``"parse"`` (:mod:`spinf_stream.engine.tokenizer`);
            ``None`` takes the pack's ``special_tokens_in_fields``.
        images: the model's :class:`~spinf_stream.models.vision.ImageFormat` (``text``,
            ``image_token_id``, ``tokens_per_image``, ``markers``), or ``None`` for a text-only model.

    Raises:
        LayoutError: (kind ``choice_tokenization``) a choice whose tokens do not extend its
            question's tokens, so ``logprob`` would be ill-defined.
        ValueError: a tokenizer that adds tokens after the text, or one that does not read the
            image reader's text as its markers and ``tokens_per_image`` soft tokens.
    """

    def __init__(
        self, tokenizer: Any, pack: Pack, max_positions: int,
        special_tokens_in_fields: SpecialTokensInFields | None = None, images: Any = None,
    ) -> None:
        self.tokenizer = PromptTokenizer(tokenizer, special_tokens_in_fields or pack.special_tokens_in_fields)
        self.images = images
        if images is not None:
            self._check_image_text()
        self.pack = pack
        self.max_positions = max_positions
        self.questions = pack.expand()
        self.q_texts = [pack.render_question(q) for q in self.questions]
        self.suffixes = [[pack.answer_prefix + c for c in q.choices] for q in self.questions]
        # positions an extraction question's answer may take after its branch
        self.written = [q.extract.max_tokens if q.extract else 0 for q in self.questions]
        # chars of each question's text that question 0's text starts with too
        self.shared_chars = [_common_prefix_len(self.q_texts[0], t) for t in self.q_texts]
        # tokens of prompt tails: the pack's text after a seam repeats from message to message
        self._tails: dict[Prompt, list[int]] = {}
        self._choices: dict[tuple[Prompt, tuple[str, ...]], list[list[int]]] = {}
        # the last seam inside each question's text before char ``n`` (memo, per pack)
        self._q_seams: dict[tuple[int, int], int | None] = {}
        self._check_choices()
        self.preamble_ids, self.preamble_chars = self._preamble_cut()

    def _check_image_text(self) -> None:
        """A picture's text must tokenize to one run of exactly ``tokens_per_image`` soft tokens
        per tile, wherever a prompt places it (as the pack's own text)."""
        r = self.images
        (ids,) = self.tokenizer.encode([Prompt("a" + r.text() + "b")], add_special_tokens=False)
        runs = _runs(ids, r.image_token_id)
        if [n for _, n in runs] != [r.tokens_per_image]:
            raise ValueError(
                f"the tokenizer does not read the model's image markers: {r.tokens_per_image} tokens "
                f"{r.image_token_id} expected in one run, got runs of {[n for _, n in runs] or 'none'}; "
                f"its tokenizer must hold {', '.join(f'{t} = {i}' for t, i in r.markers)}"
            )

    def _check_choices(self) -> None:
        """Each choice's tokens after its question's (out of a message's context): they must
        extend them; under ``first_token`` their first tokens must differ; under ``sum`` a
        question whose choices have unequal token counts is logged (longer labels lose mass)."""
        texts = [Prompt(t) for t, sufs in zip(self.q_texts, self.suffixes) for t in [t] + [t + s for s in sufs]]
        encoded = iter(self.tokenizer.encode(texts, add_special_tokens=False))
        unequal: list[str] = []
        for q in self.questions:
            base = next(encoded)
            conts = {}
            for label in q.choices:
                ids = next(encoded)
                if not _extends(base, ids):
                    raise LayoutError(
                        "choice_tokenization",
                        f"pack {self.pack.name!r}: choice {label!r} of question {q.id!r} merges with the "
                        f"question's last token; end the question template differently or change answer_prefix",
                    )
                conts[label] = ids[len(base):]
            if q.choice_scoring == "first_token":
                self._first_tokens(self.questions.index(q), list(conts.values()))
            if q.choice_scoring == "sum" and len({len(c) for c in conts.values()}) > 1:
                unequal.append(f"{q.id} ({', '.join(f'{k!r}: {len(c)}' for k, c in conts.items())})")
        if unequal:
            log.warning(
                "pack %s: %d question(s) whose choices have unequal token counts under choice_scoring sum, so a longer "
                "label loses probability for its length: %s%s. Set choice_scoring: mean (or first_token) in the pack "
                "if that is not meant", self.pack.name, len(unequal), "; ".join(unequal[:3]),
                f"; and {len(unequal) - 3} more" if len(unequal) > 3 else "")

    def _first_tokens(self, k: int, choice_tokens: list[list[int]]) -> list[list[int]]:
        """``first_token`` scoring: each choice's first token alone; they must differ."""
        firsts = [c[:1] for c in choice_tokens]
        q = self.questions[k]
        for i, f in enumerate(firsts):
            j = firsts.index(f)
            if j != i:
                raise LayoutError(
                    "choice_tokenization",
                    f"pack {self.pack.name!r}: choices {q.choices[j]!r} and {q.choices[i]!r} of question {q.id!r} begin "
                    f"with the same token, so choice_scoring first_token cannot tell them apart; use mean or sum",
                )
        return firsts

    def _preamble_cut(self) -> tuple[list[int], int]:
        """Tokens of the preamble that every message shares, and the char where the rest starts.

        The last preamble token is left to the message (it can merge with what follows);
        each message checks that its own tokens start with these.
        """
        pre = self.pack.preamble
        literal = next(iter(string.Formatter().parse(self.pack.prompt)), ("",))[0]
        ids, offs = self.tokenizer.encode_with_offsets(Prompt(pre + literal), add_special_tokens=True)
        n_special = len(self.tokenizer.prefix_ids)
        inside = sum(1 for i in range(n_special, len(ids)) if 0 < offs[i][1] <= len(pre))
        cut = n_special + max(0, inside - 1)
        chars = offs[cut][0] if cut < len(ids) else len(pre)
        return list(ids[:cut]), chars

    def _tail_tokens(self, tails: Sequence[Prompt]) -> list[list[int]]:
        """Tokens of prompt tails (no special tokens), remembered. Safe from several threads:
        each lookup is one dict operation, and what this call needs it keeps in locals."""
        got = [self._tails.get(t) for t in tails]
        missing = list(dict.fromkeys(t for t, ids in zip(tails, got) if ids is None))
        if not missing:
            return got  # type: ignore[return-value]  # no None left
        new = dict(zip(missing, self.tokenizer.encode(missing, add_special_tokens=False)))
        if len(self._tails) > 8192:  # a bound, not an eviction policy: tails are cheap to redo
            self._tails.clear()
        self._tails.update(new)
        return [ids if ids is not None else new[t] for t, ids in zip(tails, got)]

    def prefix_chars_bound(self, text: str) -> int:
        """An upper bound on the characters of a field's ``text`` that can fit the model's context:
        the chars its first ``max_positions`` (+16 for merges at the field's edges) tokens cover.
        Cheap for any length of ``text`` (see :meth:`PromptTokenizer.prefix_chars`)."""
        return self.tokenizer.prefix_chars(text, self.max_positions + 16)

    # -- prepare, step by step ---------------------------------------------------------------

    def prepare(
        self, index: int, msg_id: str, fields: dict[str, str], images: Mapping[str, Sequence[Any]] | None = None,
    ) -> PreparedMessage:
        """Tokenize one message (fields already validated as non-empty strings; ``images``: its
        picture fields, each a list of decoded RGB pictures: one image, or a video's frames, each
        placed as an image), and its views when the pack has ``views``.

        Raises:
            LayoutError: ``too_long`` when the prompt exceeds the model's context;
                ``choice_tokenization`` when a choice's tokens do not extend its prompt's;
                ``unsupported_image`` for a picture given to a text-only model, or in the field
                the pack's views cut.
        """
        if images and self.images is None:
            raise LayoutError("unsupported_image", f"field {next(iter(images))!r} holds an image; this model reads text only")
        # each picture as its prompt text and tiles, once (views reuse them)
        read = {name: [self.images.read(p) for p in pics] for name, pics in images.items()} if images else {}
        whole = self._prepare(index, msg_id, fields, read)
        spec = self.pack.views
        if spec is None:
            return whole
        if spec.field in read:
            raise LayoutError("unsupported_image", f"field {spec.field!r} holds an image; the pack's views cut its text")
        decided = {k for k, q in enumerate(self.questions) if q.id in spec.questions}
        views = []
        for v in views_of(fields[spec.field], spec.prefixes, spec.suffixes):
            m = self._prepare(index, msg_id, {**fields, spec.field: v.text}, read)
            views.append(replace(m, branches=tuple(b for b in m.branches if b.question in decided),
                                 decode_tokens=0, view=v.name))
        return replace(whole, views=tuple(views))

    def _prepare(
        self, index: int, msg_id: str, fields: dict[str, str], images: Mapping[str, Sequence[tuple[str, list[Any]]]],
    ) -> PreparedMessage:
        verbatim = {name: "".join(text for text, _ in read) for name, read in images.items()} if images else None
        text, spans = self.pack.render_prompt_spans(fields, verbatim)
        pre = len(self.pack.preamble)
        head = Prompt(self.pack.preamble + text, tuple((a + pre, b + pre) for a, b in spans))
        prompts = [head + t for t in self.q_texts]
        first, offsets = self.tokenizer.encode_with_offsets(prompts[0], add_special_tokens=True)
        seam = _SeamFinder(self, head.text)
        splits = self._question_tokens(prompts, seam, first, offsets)
        cut = self._content_cut(first, splits)
        use_preamble, prefix_len = self._preamble_use(first, offsets, cut)
        content = first[prefix_len:cut]
        own = [s.tokens_from(first, cut) for s in splits]
        choices = [self._first_tokens(k, ch) if q.choice_scoring == "first_token" else ch
                   for k, (q, ch) in enumerate(zip(self.questions, self._choice_tokens(prompts, seam, first, splits)))]
        branches = tuple(_build_branch(k, br, ch) for k, (br, ch) in enumerate(zip(own, choices)))
        self._check_length(prefix_len + len(content), branches)
        decode = sum(max(self.written[b.question] - 1, 0) for b in branches)
        slots = self._image_slots(content, images) if images else ()
        return PreparedMessage(index, msg_id, tuple(content), use_preamble, prefix_len, branches, decode, images=slots)

    def _image_slots(
        self, content: Sequence[int], images: Mapping[str, Sequence[tuple[str, list[Any]]]],
    ) -> tuple[ImageSlot, ...]:
        """Where each picture tile's soft tokens sit in the content, in prompt order. The soft
        token is written by the engine only (a field's text never yields it in ``plain`` mode)."""
        order = [tile for f in self.pack.field_occurrences if f in images for _, tiles in images[f] for tile in tiles]
        runs = _runs(content, self.images.image_token_id)
        n = self.images.tokens_per_image
        if [k for _, k in runs] != [n] * len(order):
            raise LayoutError(
                "invalid_image",
                f"the prompt's content holds {sum(k for _, k in runs)} image soft tokens where its "
                f"{len(order)} picture tile(s) need {n} each (with special_tokens_in_fields parse, a text field "
                f"holding the image marker adds some)",
            )
        both = self.images.bidirectional
        return tuple(ImageSlot(start, k, tile, both) for (start, k), tile in zip(runs, order))

    def _question_tokens(
        self, prompts: list[Prompt], seam: _SeamFinder, first: list[int], offsets: list[tuple[int, int]]
    ) -> list[_Split]:
        """Step 1: every question's whole-prompt tokens, from question 0's tokens and a seam.

        Question k's prompt agrees with question 0's on its first ``len(head) + shared_chars[k]``
        chars; up to the last seam ``p`` before that, its tokens are question 0's, and after it
        they are those of its own prompt's tail from ``p`` alone. Without a seam (or if question
        0's tokens do not break at the seam — never, if the seam argument holds), the question's
        prompt is tokenized whole.
        """
        splits: list[_Split | None] = [_Split(len(first), [])] + [None] * (len(prompts) - 1)
        tails: dict[int, tuple[int, Prompt]] = {}  # question -> (tokens before the seam, tail)
        boundary: dict[int, int | None] = {}  # seam char -> token index
        for k in range(1, len(prompts)):
            p = seam.before(k, self.shared_chars[k])
            if p is None:
                continue
            if p not in boundary:
                boundary[p] = _token_boundary(offsets, p)
            j = boundary[p]
            if j is not None:
                tails[k] = (j, prompts[k].tail(p))
        got = iter(self._tail_tokens([t for _, t in tails.values()]))
        for k, (j, _) in tails.items():
            splits[k] = _Split(j, next(got))
        whole = [k for k, s in enumerate(splits) if s is None]
        wholes = self.tokenizer.encode([prompts[k] for k in whole], add_special_tokens=True) if whole else []
        for k, ids in zip(whole, wholes):
            shared = _common_prefix_len(first, ids)
            splits[k] = _Split(shared, ids[shared:])
        return [s for s in splits if s is not None]

    @staticmethod
    def _content_cut(first: list[int], splits: list[_Split]) -> int:
        """Step 2: the content = the tokens every question's prompt starts with, leaving each
        question at least one token of its own (the row its first choice token is read from)."""
        cut = min(s.shared for s in splits)
        end = min(s.n_tokens for s in splits) - 1
        while cut < end and len({s.token(first, cut) for s in splits}) == 1:
            cut += 1
        return min(cut, max(end, 0))

    def _preamble_use(self, first: list[int], offsets: list[tuple[int, int]], cut: int) -> tuple[bool, int]:
        """Whether the message's content follows the cached preamble, and the preamble's length."""
        p = len(self.preamble_ids)
        use = (
            0 < p < cut
            and first[:p] == self.preamble_ids
            and offsets[p][0] >= self.preamble_chars
        )
        return use, p if use else 0

    def _choice_tokens(
        self, prompts: list[Prompt], seam: _SeamFinder, first: list[int], splits: list[_Split]
    ) -> list[list[list[int]]]:
        """Step 3: each choice's tokens in context: ``tokenize(prompt + answer_prefix + label)``
        after ``tokenize(prompt)``, both from the prompt's last seam (or whole, without one)."""
        out: list[list[list[int]] | None] = [None] * len(prompts)
        todo: dict[int, tuple[Prompt, list[Prompt]]] = {}  # question -> (base, base + each suffix)
        for k, prompt in enumerate(prompts):
            p = seam.before(k, len(self.q_texts[k]))
            if p is None:
                todo[k] = (prompt, [prompt + s for s in self.suffixes[k]])
                continue
            tail = prompt.tail(p)
            out[k] = self._choices.get((tail, tuple(self.suffixes[k])))
            if out[k] is None:
                todo[k] = (tail, [tail + s for s in self.suffixes[k]])
        tails = [t for k, (base, conts) in todo.items() if base is not prompts[k] for t in (base, *conts)]
        wholes = [t for k, (base, conts) in todo.items() if base is prompts[k] for t in conts]
        tail_ids = iter(self._tail_tokens(tails))
        whole_ids = iter(self.tokenizer.encode(wholes, add_special_tokens=True) if wholes else [])
        for k, (base_prompt, conts) in todo.items():
            if base_prompt is prompts[k]:
                base = splits[k].tokens_from(first, 0)
                got = [next(whole_ids) for _ in conts]
            else:
                base = next(tail_ids)
                got = [next(tail_ids) for _ in conts]
            ctoks = []
            for label, ids in zip(self.questions[k].choices, got):
                if not _extends(base, ids):
                    raise LayoutError(
                        "choice_tokenization",
                        f"choice {label!r} of question {self.questions[k].id!r} does not extend the prompt's tokens",
                    )
                ctoks.append(ids[len(base) :])
            out[k] = ctoks
            if base_prompt is not prompts[k]:
                if len(self._choices) > 8192:  # a bound, not an eviction policy
                    self._choices.clear()
                self._choices[(base_prompt, tuple(self.suffixes[k]))] = ctoks
        return [c for c in out if c is not None]

    def _check_length(self, before_branches: int, branches: Sequence[Branch]) -> None:
        """Step 4: the prompt and its longest branch must fit the model's context."""
        longest = max(max(b.depths) + 1 + self.written[b.question] for b in branches)
        total = before_branches + longest
        if total > self.max_positions:
            raise LayoutError(
                "too_long",
                f"prompt needs {total} positions (content {before_branches} + longest branch "
                f"{longest}); the model's context is {self.max_positions} tokens",
            )


class _SeamFinder:
    """Seams of one message's prompts ``head + q_texts[k]`` (:mod:`spinf_stream.engine.seams`)."""

    def __init__(self, seg: Segmenter, head: str) -> None:
        self.seg = seg
        self.seams = seg.tokenizer.seams
        self.head = head
        self._head_last: int | None = -1  # the head's own last seam, found on first use

    def before(self, k: int, n: int) -> int | None:
        """The last seam ``p`` of question k's prompt with ``p < len(head) + n``, or None."""
        seams = self.seams
        if seams is None:
            return None
        text = self.seg.q_texts[k]
        key = (k, n)
        memo = self.seg._q_seams
        if key not in memo:  # seams inside the question's text depend on the pack only
            memo[key] = seams.last(text, n)
        r = memo[key]
        if r is not None:
            return len(self.head) + r
        if n >= 1 and text and seams.is_seam(self.head[-1:] + text[0], 1):
            return len(self.head)
        if self._head_last == -1:
            self._head_last = seams.last(self.head, len(self.head))
        return self._head_last


def _runs(ids: Sequence[int], token: int) -> list[tuple[int, int]]:
    """``(start, length)`` of each maximal run of ``token`` in ``ids``."""
    out: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t != token:
            continue
        if out and out[-1][0] + out[-1][1] == i:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((i, 1))
    return out


def _token_boundary(offsets: list[tuple[int, int]], p: int) -> int | None:
    """Index of the first token starting at char ``p`` if every earlier token ends by ``p``."""
    j = len(offsets)
    while j > 0 and offsets[j - 1][0] >= p and offsets[j - 1] != (0, 0):
        j -= 1
    if j == len(offsets) or offsets[j][0] != p or (j > 0 and offsets[j - 1][1] > p):
        return None
    return j
