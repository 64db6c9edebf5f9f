"""Extraction and generation from the same read, against transformers' own greedy ``generate``.

For every family (tiny random-weight models of each family's code, with the real tokenizers): a
pack of choice, number, money, text and generate questions; each extraction's tokens, its summed
full-vocabulary logprob, its renormalised probability and its none probability equal to
``generate`` on the question's whole prompt with a logits processor that masks the tokens the
kind's grammar allows. The allowed sets here come from regular expressions written in this file
from the definition (``docs/extraction.md``), matched with the ``regex`` package's partial
matching over each token's bytes — not from the project's grammar module. Then: records bitwise
equal alone, batched, reversed and at budgets that split a message's branches and decode steps.
"""

from __future__ import annotations

import math
import textwrap

import numpy as np
import orjson
import pytest
import regex
import torch
from conftest import at_budget
from oracle import load_hf, prompt_pieces, prompt_tokens

from spinf_stream.engine import Engine, Message
from spinf_stream.packs import load_pack
from tiny import EXTRACTION_PACK as PACK
from tiny import FAMILIES


MESSAGES = [
    "Pay £250 now",
    "You won $1,000",
    "You won $1,000! Call 0800 123 4567 to claim your prize before Friday.",
    "Pay £49.99 now or your account will be closed. Regards, the bank",
    "Hi mum, 3 parcels arrived, one was €1.200,50 in customs fees?!",
    "see you at 5",
]

# --------------------------------------------------------------------- the grammars, by definition

_D = rb"[0-9]"
_THIN = "(?:\u2009|\u202f)".encode()
_NUM = (rb"(?:[1-9]" + _D + rb"{0,2}(?:," + _D + rb"{3})+(?:\." + _D + rb"+)?"
        rb"|[1-9]" + _D + rb"{0,2}(?:\." + _D + rb"{3})+(?:," + _D + rb"+)?"
        rb"|[1-9]" + _D + rb"{0,2}(?:" + _THIN + _D + rb"{3})+(?:\." + _D + rb"+)?"
        rb"|" + _D + rb"+(?:[.,]" + _D + rb"+)?)")
_SIGN = "(?:-|\\+|\u2212)?".encode()
_SYMBOL = "(?:£|\\$|€|¥|₹|₩|₽|₺)".encode()
_CODES = b"(?:USD|GBP|EUR|JPY|CNY|INR|KRW|RUB|TRY|AUD|CAD|CHF|NZD|HKD|SGD|SEK|NOK|DKK|PLN|ZAR|BRL|MXN|AED|SAR)"
_WORDS = (b"(?:dollars?|pounds?|euros?|rupees?|yen|won|rubles?|roubles?|lira|yuan|francs?)")
NUMBER = _SIGN + _NUM + b"%?"
_SCALED = _NUM + b"(?: thousand| million| billion| trillion|k|m|bn|tn)?"
MONEY = _SIGN + b"(?:(?:" + _SYMBOL + b"|" + _CODES + b") ?" + _SCALED + b"|" + _SCALED + b" ?(?:" + _SYMBOL + b"|" + _CODES + b"|" + _WORDS + b"))"


def _definition(kind: str) -> regex.Pattern:
    body = NUMBER if kind == "number" else MONEY
    return regex.compile(b" *(?:" + body + b"|none)")


def _token_bytes(tok) -> list[bytes]:
    """Each token's bytes, from the tokenizer's own token strings: byte-level BPE through GPT-2's
    byte map, SentencePiece through '▁' and <0xNN>; special tokens b""."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    special = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}
    pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
    spm = any(p.startswith("▁") for p in pieces[:5000] if p)
    out = []
    for i, p in enumerate(pieces):
        if i in special or p is None:
            out.append(b"")
        elif spm:
            m = regex.fullmatch(r"<0x([0-9A-F]{2})>", p)
            out.append(bytes([int(m.group(1), 16)]) if m else p.replace("▁", " ").encode())
        else:
            out.append(bytes(byte_of[c] for c in p) if all(c in byte_of for c in p) else p.encode())
    return out


class _Allowed:
    """The allowed next tokens of one kind after the bytes written so far (by the definition)."""

    def __init__(self, kind: str, vocab: list[bytes], eos: int) -> None:
        self.pattern = _definition(kind)
        alphabet = set(b" 0123456789,.%+-") | set("\u2212\u2009\u202f£$€¥₹₩₽₺".encode())
        alphabet |= set(b"USDGBPEURJPYCNYINRKRWRUBTRYAUDCADCHFNZDHKDSGDSEKNOKDKKPLNZARBRLMXNAEDSAR")
        alphabet |= set(b"dollarspoundeurosrupeyenwbluiaxfcn") | set(b"thousandmillionbilliontrillionkmbnt")  # words, scales
        self.vocab = vocab
        self.candidates = [t for t, b in enumerate(vocab) if b and set(b) <= alphabet]
        self.first_bytes = {vocab[t][0] for t in self.candidates}
        self.stops = sorted({eos} | {t for t, b in enumerate(vocab) if b.startswith(b"\n")})

    def __call__(self, written: bytes) -> list[int]:
        # what partially matches is prefix-closed: a token can continue ``written`` only if its
        # first byte can (the same test, on fewer strings)
        firsts = {c for c in self.first_bytes
                  if self.pattern.fullmatch(written + bytes([c]), partial=True)}
        ok = [t for t in self.candidates
              if self.vocab[t][0] in firsts and self.pattern.fullmatch(written + self.vocab[t], partial=True)]
        if written.strip(b" ") and self.pattern.fullmatch(written):
            ok += self.stops
        return sorted(set(ok))


def _none_starts(vocab: list[bytes], allowed=None) -> list[int]:
    """Tokens whose text, leading spaces dropped, begins the none word "none" (by the definition)."""
    return [k for k in (allowed if allowed is not None else range(len(vocab)))
            if vocab[k].lstrip(b" ") and b"none".startswith(vocab[k].lstrip(b" "))]


def _oracle(hf, tok, pack, fields: dict, question, vocab: list[bytes], value_only: bool = False) -> dict:
    """transformers' greedy generate on the question's whole prompt, masked to the allowed set
    (``value_only``: at the first step the tokens that begin the none word are not chosen, but
    still count in the renormalisation, as a calibration that decided "a value" does)."""
    from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

    ids = prompt_tokens(tok, [*prompt_pieces(pack, fields), (pack.render_question(question), False)], "plain")
    x = question.extract
    full = x.kind in ("text", "generate")
    allowed = None if full else _Allowed(x.kind, vocab, tok.eos_token_id)
    n0 = len(ids)
    sets: list[list[int] | None] = []

    class Mask(LogitsProcessor):
        def __call__(self, input_ids, scores):
            written = b"".join(vocab[t] for t in input_ids[0, n0:].tolist())
            first = value_only and input_ids.shape[1] == n0
            if allowed is None:
                sets.append(None)
                if first:
                    scores = scores.clone()
                    scores[:, _none_starts(vocab)] = -math.inf
                return scores
            keep = allowed(written)
            sets.append(keep)
            choose = [k for k in keep if k not in set(_none_starts(vocab, keep))] if first else keep
            masked = torch.full_like(scores, -math.inf)
            masked[:, choose] = scores[:, choose]
            return masked

    class TextStop(StoppingCriteria):
        def __call__(self, input_ids, scores, **kw):
            last = input_ids[0, -1].item()
            text = b"".join(vocab[t] for t in input_ids[0, n0:].tolist())
            return torch.tensor([input_ids.shape[1] > n0 and (vocab[last] == b"" or x.stop.encode() in text)])

    stops = [tok.eos_token_id] if full else allowed.stops
    out = hf.generate(
        torch.tensor([ids]), max_new_tokens=x.max_tokens, do_sample=False, logits_processor=LogitsProcessorList([Mask()]),
        stopping_criteria=StoppingCriteriaList([TextStop()] if full else []), eos_token_id=stops,
        pad_token_id=tok.eos_token_id, output_logits=True, return_dict_in_generate=True, top_k=None, top_p=None,
    )
    new = out.sequences[0, n0:].tolist()
    logprob, log_p, none_p = 0.0, 0.0, None
    for step, (t, raw) in enumerate(zip(new, out.logits)):
        lsm = torch.log_softmax(raw[0].float(), -1)
        logprob += float(lsm[t])
        keep = sets[step]
        if keep is None:
            log_p += float(lsm[t])
        else:
            vals = raw[0, keep].double()
            log_p += float(raw[0, t].double() - torch.logsumexp(vals, 0))
        if step == 0 and x.none is not None:
            starts = _none_starts(vocab, keep)
            denom = torch.logsumexp(raw[0, keep].double(), 0) if keep is not None else torch.logsumexp(raw[0].double(), 0)
            none_p = float(torch.exp(torch.logsumexp(raw[0, starts].double(), 0) - denom)) if starts else 0.0
    stopped = bool(new) and (new[-1] in stops or vocab[new[-1]] == b"")
    written = new[:-1] if stopped and (not full or vocab[new[-1]] == b"" or new[-1] in stops) else new
    return {"tokens": written, "logprob": logprob, "probability": math.exp(log_p), "none_probability": none_p}


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    path = tmp_path_factory.mktemp("packs") / "extracting.yaml"
    path.write_text(textwrap.dedent(PACK))
    return load_pack(path)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_extraction_equals_transformers_greedy_generate_masked_to_its_grammar(tiny_models, loaded, pack, family):
    path = tiny_models(family)
    decoder, tok = loaded(path)
    engine = Engine(decoder, tok, pack, family)
    records = engine.score([Message(id=str(i), fields={"text": t}) for i, t in enumerate(MESSAGES[:2])])
    hf = load_hf(str(path))
    vocab = _token_bytes(tok)
    questions = {q.id: q for q in pack.expand()}
    for rec, text in zip(records, MESSAGES):
        assert set(rec.scores["spam"].choices) == {"yes", "no"}
        for qid in ("count", "amount", "who", "gist"):
            got, want = rec.scores[qid], _oracle(hf, tok, pack, {"text": text}, questions[qid], vocab)
            assert got.kind == questions[qid].extract.kind
            assert got.tokens == len(want["tokens"]), (qid, got, want)
            written = b"".join(vocab[t] for t in want["tokens"])
            if got.answer is not None:
                assert written.decode("utf-8", "replace").strip(" ").startswith(got.answer.split("\n")[0][:1]), (qid, got)
            steps = got.tokens + 1  # within 1e-4 a step (the stop step included)
            assert got.logprob == pytest.approx(want["logprob"], abs=1e-4 * steps), (qid, got, want)
            assert got.probability == pytest.approx(want["probability"], abs=1e-4 * steps), (qid, got, want)
            if want["none_probability"] is None:
                assert got.none_probability is None
            else:
                assert got.none_probability == pytest.approx(want["none_probability"], abs=1e-4), (qid, got, want)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_extraction_records_are_bitwise_equal_alone_batched_reversed_and_split(tiny_models, loaded, pack, family):
    decoder, tok = loaded(tiny_models(family))
    texts = MESSAGES if family == "llama" else MESSAGES[1:5]  # Gemma's 262k vocabulary costs more a step
    msgs = [Message(id=str(i), fields={"text": t}) for i, t in enumerate(texts)]

    engine = Engine(decoder, tok, pack, family)

    def run(batch, budget):
        return {r.id: orjson.dumps(r.model_dump()) for r in at_budget(engine, budget).score(batch)}

    together = run(msgs, 16384)
    alone = {}
    for m in msgs:
        alone.update(run([m], 16384))
    assert alone == together
    assert run(msgs[::-1], 40) == together  # branches and decode steps spread over passes
    if family == "llama":  # the smallest budget: a pass per branch or decode tip
        shuffled = [msgs[4], msgs[2], msgs[0], msgs[5], msgs[3], msgs[1]]
        assert run(shuffled, 16) == together


def test_the_digest_covers_the_extractions(tiny_models, loaded, pack):
    from spinf_stream.engine.results import digest

    decoder, tok = loaded(tiny_models("llama"))
    rec = Engine(decoder, tok, pack, "llama").score([Message(id="a", fields={"text": MESSAGES[1]})])[0]
    plain = orjson.loads(orjson.dumps(rec.model_dump()))
    assert rec.digest == digest(plain["scores"]) and set(plain["scores"]["amount"]) >= {"value", "probability", "logprob"}


def test_a_decode_step_feeds_each_open_extraction_s_newest_token_only(tiny_models, loaded, pack):
    """Content and branch keys/values are kept, never recomputed: after the prefill (each message's
    content and branches once), every row fed is one written token of one extraction, so the rows
    fed lie between the written tokens less one per extraction and the written tokens."""
    decoder, tok = loaded(tiny_models("llama"))
    eng = Engine(decoder, tok, pack, "llama")
    msgs = [Message(id=str(i), fields={"text": t}) for i, t in enumerate(MESSAGES[2:4])]
    prepared = eng.prepare(msgs)
    recs = eng.run(prepared)
    stats = eng.last_run
    decode_rows = stats.tokens_fed - sum(p.n_tokens for p in prepared)
    n = sum(1 for r in recs for s in r.scores.values() if hasattr(s, "tokens"))
    written = sum(s.tokens for r in recs for s in r.scores.values() if hasattr(s, "tokens"))
    assert n == 8 and stats.extracted_tokens == written
    assert written - n <= decode_rows <= written
    # what the batcher counts: the prefill and, at most, the decode steps
    bound = sum(q.extract.max_tokens - 1 for q in pack.expand() if q.extract is not None)
    assert all(p.decode_tokens == bound and p.cost_tokens == p.n_tokens + bound for p in prepared)
    assert decode_rows <= sum(p.decode_tokens for p in prepared)
    longest = max(s.tokens for r in recs for s in r.scores.values() if hasattr(s, "tokens"))
    assert stats.decode_passes == longest - 1 or stats.decode_passes == longest  # one pass per step, all tips


def test_the_triton_path_writes_the_same_values_as_the_torch_path(tiny_models, loaded, pack):
    from spinf_stream.models import load_decoder
    from spinf_stream.models.triton_backend import interpreter_on

    if not interpreter_on():
        pytest.skip("the Triton kernels run on the CPU only with TRITON_INTERPRET=1: conftest sets it, so the test "
                    "runs in make test and CI unless TRITON_INTERPRET=0 is set by hand")
    path = tiny_models("llama")
    decoder, tok = loaded(path)
    msgs = [Message(id=str(i), fields={"text": t}) for i, t in enumerate(MESSAGES[:2])]
    want = Engine(decoder, tok, pack, "llama").score(msgs)
    got = Engine(load_decoder(path, kernels="triton"), tok, pack, "llama").score(msgs)
    for g, w in zip(got, want):
        for qid in ("count", "amount", "who", "gist"):
            a, b = g.scores[qid], w.scores[qid]
            assert (a.answer, a.value, a.tokens) == (b.answer, b.value, b.tokens), qid
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4) and a.probability == pytest.approx(b.probability, abs=1e-4)


#: (message, question): values that tokenize awkwardly (separators, decimals, percent, codes, words,
#: a minus, multi-byte symbols, a value longer than max_tokens) and a message with none
AWKWARD = [
    ("Shares rose 3.5% after the results.", "count"),
    ("Total due: £49.99 by Friday.", "amount"),
    ("Bitte überweisen Sie € 1.200,50 bis Montag.", "amount"),
    ("Invoice 7: USD 250 now, or 250 rupees in cash.", "amount"),
    ("It fell to -12 degrees overnight.", "count"),
    ("Thanks, see you tomorrow!", "amount"),
    ("A fine of ₹3,000 for 1,250,000,000 users.", "count"),
]
#: the default model's plain money messages, and the value and currency it must extract
PLAIN_MONEY = {"Pay £250 now": (250.0, "GBP"), "You won $1,000": (1000.0, "USD")}


@pytest.mark.real_model
@pytest.mark.parametrize("model", ["smollm2-135m", "gemma-3-270m", "qwen2.5-coder-0.5b"])
def test_real_models_extract_awkward_values_like_transformers_masked_generate(loaded, pack, model):
    """The three shipped models on values that tokenize awkwardly: the same text, token count,
    logprob, probability and none probability as transformers' masked greedy generate. The
    default model also extracts the amount and currency of plain money messages right."""
    from spinf_stream.models.resolve import resolve

    path = resolve(model).path
    decoder, tok = loaded(path)
    cases = AWKWARD + ([(t, "amount") for t in PLAIN_MONEY] if model == "qwen2.5-coder-0.5b" else [])
    records = Engine(decoder, tok, pack, model).score([Message(id=str(i), fields={"text": t}) for i, (t, _) in enumerate(cases)])
    hf, vocab = load_hf(str(path)), _token_bytes(tok)
    questions = {q.id: q for q in pack.expand()}
    for rec, (text, qid) in zip(records, cases):
        got, want = rec.scores[qid], _oracle(hf, tok, pack, {"text": text}, questions[qid], vocab)
        written = b"".join(vocab[t] for t in want["tokens"]).decode("utf-8").strip(" ")
        assert got.tokens == len(want["tokens"]), (model, text, qid, got, written)
        assert (got.answer is None and written == "none") or got.answer == written, (model, text, qid, got, written)
        steps = got.tokens + 1  # within 1e-4 a step (the stop step included)
        assert got.logprob == pytest.approx(want["logprob"], abs=1e-4 * steps), (model, text, qid, got, want)
        assert got.probability == pytest.approx(want["probability"], abs=1e-4 * steps), (model, text, qid, got, want)
        assert got.none_probability == pytest.approx(want["none_probability"], abs=1e-4), (model, text, qid)
        if text in PLAIN_MONEY:
            assert (got.value, got.currency) == PLAIN_MONEY[text], (text, got)


@pytest.mark.parametrize(("text", "whole"), [
    ("💰".encode(), "💰".encode()), ("💰".encode()[:3], b""), ("a€".encode()[:2], b"a"), (b"abc", b"abc"),
    ("é".encode()[:1], b""), ("aé".encode(), "aé".encode()),
])
def test_a_text_cut_by_max_tokens_inside_a_character_drops_the_partial_character(text, whole):
    from spinf_stream.engine.decoding import _whole_characters

    assert _whole_characters(text) == whole


def _decode(kind: str, picks: list[int], max_tokens: int):
    """An extraction driven token by token over a small vocabulary: each step's logits favour
    ``picks[step]`` (a breaker's report: values cut by max_tokens)."""
    from spinf_stream.engine.decoding import OpenExtraction
    from spinf_stream.engine.grammar import GrammarSpec, TokenGrammar
    from spinf_stream.engine.segment import Branch
    from spinf_stream.packs.pack import Extraction

    vocab = [b"", b"\n", b" 2", b"5", b"0", b" \xe2", b"\x82", b"\xac"]  # EOS, newline, digits, "€" in pieces
    g = TokenGrammar.build(GrammarSpec(kind, none=None), vocab, {0})
    o = OpenExtraction(0, 0, Extraction(kind, max_tokens, "\n", None), g, Branch(0, (1,), (-1,), (0,), (0,), ()), g.start)
    for pick in picks:
        if o.done:
            break
        logits = torch.full((len(vocab),), -5.0)
        logits[pick] = 5.0
        o.step(logits, torch.logsumexp(logits, 0), vocab)
    return o.result()


def test_a_number_or_amount_ended_by_max_tokens_has_no_value_and_no_partial_character():
    stopped = _decode("number", [2, 3, 4, 1], max_tokens=4)
    assert (stopped.answer, stopped.value, stopped.tokens) == ("250", 250.0, 3)
    cut = _decode("number", [2, 3, 4, 1], max_tokens=3)  # "250" and the model still writing
    assert (cut.answer, cut.value, cut.tokens) == ("250", None, 3)
    money = _decode("money", [2, 3, 4, 5, 6, 7, 1], max_tokens=7)
    assert (money.answer, money.value, money.currency) == ("250 €", 250.0, "EUR")
    half = _decode("money", [2, 3, 4, 5, 6, 7, 1], max_tokens=5)  # cut inside "€"
    assert (half.answer, half.value, half.currency, half.tokens) == ("250 ", None, None, 5)


def test_a_question_s_own_template_scores_as_a_pack_whose_template_it_is(tiny_models, loaded, tmp_path):
    """The engine asks a question with its own ``question:`` exactly as a pack whose template that
    is: same answer, value and log-probabilities (the other pack's branches differ, so the two
    are compared at the tolerance of the oracle tests, not bitwise)."""
    from spinf_stream.engine import Engine, Message
    from spinf_stream.packs import load_pack

    head = ('name: p\nversion: 1.0.0\ndescription: d\npreamble: "Read it.\\n"\nprompt: "Text: {text}\\n"\n'
            'question: "{TEMPLATE}"\nchoices: [yes, no]\nquestions:\n')
    amount = "  - {id: amount, text: How much money, extract: money, max_tokens: 5OWN}\n"
    own = head.replace("{TEMPLATE}", "Q: {question}\\nA (yes or no):") + "  - {id: spam, text: Is it spam}\n" + \
        amount.replace("OWN", ', question: "Q: {question}\\nA:"')
    plain = head.replace("{TEMPLATE}", "Q: {question}\\nA:") + amount.replace("OWN", "")
    (tmp_path / "own.yaml").write_text(own)
    (tmp_path / "plain.yaml").write_text(plain)
    decoder, tok = loaded(tiny_models("llama"))
    msgs = [Message(id=str(i), fields={"text": t}) for i, t in enumerate(MESSAGES)]
    a = Engine(decoder, tok, load_pack(tmp_path / "own.yaml"), "tiny").score(msgs)
    b = Engine(decoder, tok, load_pack(tmp_path / "plain.yaml"), "tiny").score(msgs)
    for x, y in zip(a, b, strict=True):
        sx, sy = x.scores["amount"], y.scores["amount"]
        assert (sx.answer, sx.value, sx.tokens) == (sy.answer, sy.value, sy.tokens)
        assert sx.logprob == pytest.approx(sy.logprob, abs=1e-4)
        assert sx.probability == pytest.approx(sy.probability, abs=1e-4)


def _none_calibration(pack, none_bias: float):
    """A calibration whose none maps (every extraction question with a none word) answer none
    (``none_bias`` > 0 large) or a value (< 0 large) whatever the message."""
    from spinf_stream import calibration as cal
    from spinf_stream.calibration.fit import question_map

    maps = {q.id: question_map(np.array([1.0, 1.0]), np.array([none_bias, 0.0]), cal.NONE_CHOICES, None)
            for q in pack.expand() if q.extract is not None and q.extract.none is not None}
    return cal.build(pack, cal.ModelIdentity(name="tiny", weights_sha256="0" * 64), "vector", "accuracy", maps)


def test_a_calibration_that_decides_none_answers_none_without_writing_it(tiny_models, loaded, pack):
    decoder, tok = loaded(tiny_models("llama"))
    msgs = [Message(id=str(i), fields={"text": t}) for i, t in enumerate(MESSAGES)]
    raw = Engine(decoder, tok, pack, "tiny").score(msgs)
    got = Engine(decoder, tok, pack, "tiny", calibration=_none_calibration(pack, 50.0)).score(msgs)
    for r, g in zip(raw, got, strict=True):
        for qid in ("count", "amount", "who"):
            s, x = g.scores[qid], r.scores[qid]
            assert (s.answer, s.value, s.tokens) == (None, None, 0)
            assert s.none_probability == x.none_probability  # the raw number, bitwise
            assert s.probability == pytest.approx(x.none_probability, rel=1e-12)
            assert s.none_calibrated == pytest.approx(1.0 / (1.0 + (1 - x.none_probability) / x.none_probability
                                                             * math.exp(-50.0)), rel=1e-9)
        assert g.scores["gist"] == r.scores["gist"]  # generate has no none word: untouched
        assert g.scores["spam"].choices["yes"].logprob == r.scores["spam"].choices["yes"].logprob


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_calibration_that_decides_a_value_writes_transformers_greedy_value_without_the_none_word(tiny_models, loaded, pack, family):
    path = tiny_models(family)
    decoder, tok = loaded(path)
    texts = MESSAGES[:3]
    calibration = _none_calibration(pack, -50.0)
    records = Engine(decoder, tok, pack, family, calibration=calibration).score(
        [Message(id=str(i), fields={"text": t}) for i, t in enumerate(texts)])
    hf = load_hf(str(path))
    vocab = _token_bytes(tok)
    questions = {q.id: q for q in pack.expand()}
    for rec, text in zip(records, texts):
        for qid in ("count", "amount", "who"):
            got, want = rec.scores[qid], _oracle(hf, tok, pack, {"text": text}, questions[qid], vocab, value_only=True)
            assert got.answer is not None and got.none_calibrated < 1e-6
            assert got.tokens == len(want["tokens"]), (qid, got, want)
            steps = got.tokens + 1
            assert got.logprob == pytest.approx(want["logprob"], abs=1e-4 * steps), (qid, got, want)
            assert got.probability == pytest.approx(want["probability"], abs=1e-4 * steps), (qid, got, want)
            assert got.none_probability == pytest.approx(want["none_probability"], abs=1e-4)


def test_calibrated_extractions_are_bitwise_equal_alone_batched_and_split(tiny_models, loaded, pack):
    decoder, tok = loaded(tiny_models("llama"))
    msgs = [Message(id=str(i), fields={"text": t}) for i, t in enumerate(MESSAGES)]
    for bias in (-50.0, 50.0):
        cal_ = _none_calibration(pack, bias)

        engine = Engine(decoder, tok, pack, "tiny", calibration=cal_)

        def run(batch, budget):
            return {r.id: orjson.dumps(r.model_dump()) for r in at_budget(engine, budget).score(batch)}

        together = run(msgs, 16384)
        alone = {}
        for m in msgs:
            alone.update(run([m], 16384))
        assert alone == together
        assert run(msgs[::-1], 40) == together
