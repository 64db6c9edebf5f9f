"""Constrained decoding by kind (spinf_stream.engine.grammar): the languages, their values, and
the allowed sets over real vocabularies, checked against a brute force with ``regex``."""

from __future__ import annotations

from functools import cache

import pytest
import regex

from spinf_stream.engine.grammar import Extracted, GrammarSpec, TokenGrammar, token_bytes

MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "gemma-3-270m")
THIN, NNBSP, MINUS = "\u2009", "\u202f", "\u2212"

#: one token per byte, and EOS as id 256: the grammar's language read byte by byte
BYTE_VOCAB = [bytes([b]) for b in range(256)] + [b""]
BYTE_EOS = 256


@cache
def tokenizer(name: str):
    from transformers import AutoTokenizer

    from spinf_stream.models.resolve import resolve

    tok = AutoTokenizer.from_pretrained(str(resolve(name).path))
    return tok, token_bytes(tok)


def byte_grammar(kind: str, **spec) -> TokenGrammar:
    return TokenGrammar.build(GrammarSpec(kind, **spec), BYTE_VOCAB, [BYTE_EOS])


def read(grammar: TokenGrammar, ids: list[int], vocab, stops: list[int]) -> Extracted | None:
    """Walks ``ids`` through the grammar; None if a token is refused or no stop token may follow."""
    state = grammar.start
    for i in ids:
        if i not in grammar.allowed(state).tolist():
            return None
        state = grammar.advance(state, i)
    allowed = set(grammar.allowed(state).tolist())
    if not all(s in allowed for s in stops):
        return None
    return grammar.finish(state, b"".join(vocab[i] for i in ids))


def read_bytes(grammar: TokenGrammar, text: str) -> Extracted | None:
    return read(grammar, list(text.encode()), BYTE_VOCAB, [BYTE_EOS, ord("\n")])


# --- the languages and their values, byte by byte ---------------------------------------------------

NUMBERS = [
    ("1,000,000", 1_000_000.0),
    ("3.5%", 3.5),
    ("1.200,50", 1200.5),
    ("-42", -42.0),
    ("+7", 7.0),
    (MINUS + "3", -3.0),
    ("1,5", 1.5),
    ("1,000", 1000.0),  # three digits after one separator: thousands
    ("1.000", 1000.0),
    ("1,00", 1.0),
    ("1,0000", 1.0),  # four digits: no thousands group, so a decimal comma
    ("0.125", 0.125),  # a first group of 0 is no thousands group
    ("12,345.67", 12345.67),
    ("1,000.000", 1000.0),
    ("1234.5", 1234.5),
    (f"12{THIN}345", 12345.0),
    (f"1{NNBSP}234{NNBSP}567.5", 1234567.5),
    ("007", 7.0),
    ("50%", 50.0),
    ("   8", 8.0),
]

NOT_NUMBERS = [
    "12abc", "1,000.000,5", "1,000,5", "1.000.5", "1,00,000", f"1{THIN}000,5",
    f"1,000{THIN}000", "1 000", "1,", ".5", "5 %", "%5", "--5", "5-", "", "   ", "none5", "None",
    "$5", "5 dollars",
]  # fmt: skip

MONEY = [
    ("£49.99", 49.99, "GBP"),
    ("€ 1.200,50", 1200.5, "EUR"),
    ("USD 250", 250.0, "USD"),
    ("USD250", 250.0, "USD"),
    ("250 USD", 250.0, "USD"),
    ("250 rupees", 250.0, "INR"),
    ("1 rupee", 1.0, "INR"),
    ("$1,000", 1000.0, "USD"),
    ("-$5", -5.0, "USD"),
    (MINUS + "€3", -3.0, "EUR"),
    ("5 €", 5.0, "EUR"),
    ("5 yen", 5.0, "JPY"),
    ("¥500", 500.0, "JPY"),
    ("₹250", 250.0, "INR"),
    (f"₩1{THIN}000", 1000.0, "KRW"),
    ("₽7", 7.0, "RUB"),
    ("₺5", 5.0, "TRY"),
    ("3 pounds", 3.0, "GBP"),
    ("7 euros", 7.0, "EUR"),
    ("2 roubles", 2.0, "RUB"),
    ("2 ruble", 2.0, "RUB"),
    ("9 yuan", 9.0, "CNY"),
    ("4 lira", 4.0, "TRY"),
    ("10 francs", 10.0, "CHF"),
    ("12 won", 12.0, "KRW"),
    ("1 dollar", 1.0, "USD"),
    ("2.5 dollars", 2.5, "USD"),
    ("CHF 5", 5.0, "CHF"),
    ("SAR12", 12.0, "SAR"),
    ("£2.3bn", 2.3e9, "GBP"),
    ("$5m", 5e6, "USD"),
    ("€12k", 12e3, "EUR"),
    ("$1.1tn", 1.1e12, "USD"),
    ("USD 1.2 billion", 1.2e9, "USD"),
    ("$5 million", 5e6, "USD"),
    ("2.3 billion dollars", 2.3e9, "USD"),
    ("400 thousand rupees", 4e5, "INR"),
    ("£1,500m", 1.5e9, "GBP"),
    ("3 trillion yen", 3e12, "JPY"),
]

NOT_MONEY = [
    "250", "$-5", "$ $5", "USD 250 USD", "rupees 250", "$  5", "5  yen", "$5%", "usd 5", "£",
    "5 Dollars", "1,000.000,5 EUR", "XYZ 5", "none!",
    "$5 m", "$5million", "$m", "$bn5", "5bn", "$5bnk", "£2.3 bn", "$5 Million", "£5mm",
]  # fmt: skip


@pytest.mark.parametrize(("text", "value"), NUMBERS)
def test_number_grammar_reads_the_written_value(text, value):
    assert read_bytes(byte_grammar("number"), text) == Extracted(text.lstrip(" "), value, None)


@pytest.mark.parametrize("text", NOT_NUMBERS)
def test_number_grammar_refuses_what_is_no_number(text):
    assert read_bytes(byte_grammar("number"), text) is None


@pytest.mark.parametrize(("text", "value", "currency"), MONEY)
def test_money_grammar_reads_amount_and_currency(text, value, currency):
    assert read_bytes(byte_grammar("money"), text) == Extracted(text, value, currency)


@pytest.mark.parametrize("text", NOT_MONEY)
def test_money_grammar_refuses_what_is_no_amount_of_money(text):
    assert read_bytes(byte_grammar("money"), text) is None


def test_dollar_takes_the_default_currency():
    g = byte_grammar("money", currency_default="CAD")
    assert read_bytes(g, "$1,000") == Extracted("$1,000", 1000.0, "CAD")
    assert read_bytes(g, "3 dollars") == Extracted("3 dollars", 3.0, "CAD")
    assert read_bytes(g, "£2") == Extracted("£2", 2.0, "GBP")


@pytest.mark.parametrize("kind", ["number", "money", "text"])
def test_none_word_is_no_value(kind):
    assert read_bytes(byte_grammar(kind), "  none") == Extracted(None, None, None)
    assert read_bytes(byte_grammar(kind, none="n/a"), "n/a") == Extracted(None, None, None)


def test_without_a_none_word_none_is_refused():
    assert read_bytes(byte_grammar("number", none=None), "none") is None


def test_an_unfinished_value_keeps_its_text_and_has_no_value():
    g = byte_grammar("money")
    state = g.start
    for b in " £4.".encode():
        state = g.advance(state, b)
    assert not g.is_complete(state) and BYTE_EOS not in g.allowed(state).tolist()
    assert g.finish(state, " £4.".encode()) == Extracted("£4.", None, None)
    assert g.finish(None, " £4.".encode()) == Extracted("£4.", None, None)
    assert g.finish(None, " £4.5".encode()) == Extracted("£4.5", 4.5, "GBP")


def test_advance_refuses_stop_tokens_and_tokens_not_allowed():
    g = byte_grammar("number")
    with pytest.raises(ValueError, match="stop token"):
        g.advance(g.start, BYTE_EOS)
    with pytest.raises(ValueError, match="not allowed"):
        g.advance(g.start, ord("a"))


def test_unknown_kind_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="'date'"):
        GrammarSpec("date")  # type: ignore[arg-type]


# --- token bytes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_token_bytes_round_trip_multibyte_characters(name):
    tok, vocab = tokenizer(name)
    assert len(vocab) == len(tok)
    for s in ["€5", " ₹250", "naïve", "🙂 ok", "a\nb", " £49.99", "日本語", "ꙮ"]:  # ꙮ: Gemma byte fallback
        ids = tok.encode(s, add_special_tokens=False)
        assert b"".join(vocab[i] for i in ids) == s.encode() == tok.decode(ids).encode(), s


@pytest.mark.parametrize("name", MODELS)
def test_token_bytes_of_special_tokens_are_empty(name):
    tok, vocab = tokenizer(name)
    assert vocab[tok.eos_token_id] == b""
    assert vocab[tok.encode("\n", add_special_tokens=False)[0]] == b"\n"


# --- real vocabularies -----------------------------------------------------------------------------

WALKS = [
    (GrammarSpec("number"), "250", Extracted("250", 250.0, None)),
    (GrammarSpec("number"), "1,000,000", Extracted("1,000,000", 1_000_000.0, None)),
    (GrammarSpec("number"), "3.5%", Extracted("3.5%", 3.5, None)),
    (GrammarSpec("number"), MINUS + "42", Extracted(MINUS + "42", -42.0, None)),
    (GrammarSpec("number"), "1.200,50", Extracted("1.200,50", 1200.5, None)),
    (GrammarSpec("number"), "none", Extracted(None, None, None)),
    (GrammarSpec("money"), "£49.99", Extracted("£49.99", 49.99, "GBP")),
    (GrammarSpec("money"), "€ 1.200,50", Extracted("€ 1.200,50", 1200.5, "EUR")),
    (GrammarSpec("money"), "USD 250", Extracted("USD 250", 250.0, "USD")),
    (GrammarSpec("money"), "250 rupees", Extracted("250 rupees", 250.0, "INR")),
    (GrammarSpec("money", currency_default="CAD"), "$1,000", Extracted("$1,000", 1000.0, "CAD")),
    (GrammarSpec("money"), "₹250", Extracted("₹250", 250.0, "INR")),  # SmolLM2: ₹ over two tokens
    (GrammarSpec("money"), "₺5", Extracted("₺5", 5.0, "TRY")),  # SmolLM2, Qwen: ₺ over three
    (GrammarSpec("money"), "-$5", Extracted("-$5", -5.0, "USD")),
    (GrammarSpec("text"), "Lunch at 1?", Extracted("Lunch at 1?", "Lunch at 1?", None)),
]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(("spec", "text", "expected"), WALKS, ids=[w[1] for w in WALKS])
def test_encoded_answer_walks_through_the_grammar(name, spec, text, expected):
    tok, vocab = tokenizer(name)
    g = TokenGrammar.build(spec, vocab, [tok.eos_token_id])
    ids = tok.encode(" " + text, add_special_tokens=False)
    newline = tok.encode("\n", add_special_tokens=False)
    assert len(newline) == 1
    assert read(g, ids, vocab, [tok.eos_token_id, newline[0]]) == expected


def test_a_symbol_split_into_byte_tokens_is_followed_byte_by_byte():
    tok, vocab = tokenizer("smollm2-135m")
    one = {t[0]: i for i, t in enumerate(vocab) if len(t) == 1}
    g = TokenGrammar.build(GrammarSpec("money"), vocab, [tok.eos_token_id])
    ids = [one[b] for b in " €5".encode()]  # € = e2 82 ac, one token each
    assert read(g, ids, vocab, [tok.eos_token_id]) == Extracted("€5", 5.0, "EUR")
    number = TokenGrammar.build(GrammarSpec("number"), vocab, [tok.eos_token_id])
    assert one[0xE2] in number.allowed(number.start).tolist()  # − U+2212 starts with e2
    assert one[0xC2] not in number.allowed(number.start).tolist()  # no number character starts with c2


def test_text_allows_every_token_and_stops_at_the_newline():
    tok, vocab = tokenizer("smollm2-135m")
    eos = tok.eos_token_id
    g = TokenGrammar.build(GrammarSpec("text"), vocab, [eos])
    assert g.allowed(g.start).tolist() == sorted({i for i, t in enumerate(vocab) if t} | {eos})
    assert g.is_stop(eos) and g.is_stop(tok.encode("\n", add_special_tokens=False)[0])
    assert all(g.is_stop(i) == t.startswith(b"\n") for i, t in enumerate(vocab) if i != eos)
    state = g.advance(g.start, tok.encode(" hello", add_special_tokens=False)[0])
    assert g.finish(state, b" hello") == Extracted("hello", "hello", None)


def test_text_with_the_stop_inside_a_token_allows_only_stop_tokens():
    tok, vocab = tokenizer("smollm2-135m")
    g = TokenGrammar.build(GrammarSpec("text"), vocab, [tok.eos_token_id])
    inside = next(i for i, t in enumerate(vocab) if b"\n" in t[1:] and not t.startswith(b"\n"))
    state = g.advance(g.start, inside)
    assert set(g.allowed(state).tolist()) == {tok.eos_token_id} | {i for i, t in enumerate(vocab) if t.startswith(b"\n")}
    text = b"ok" + vocab[inside]
    assert g.finish(state, text) == Extracted(*[text.split(b"\n")[0].decode()] * 2, None)


def test_text_with_a_stop_string_over_two_tokens_stops_after_it():
    tok, vocab = tokenizer("smollm2-135m")
    g = TokenGrammar.build(GrammarSpec("text", stop="##"), vocab, [tok.eos_token_id])
    hash_ = vocab.index(b"#")
    state = g.advance(g.advance(g.start, vocab.index(b"a")), hash_)
    assert len(g.allowed(state)) > 1000  # one '#' so far: anything may follow
    closing = next(i for i, t in enumerate(vocab) if len(t) > 1 and t[:1] == b"#" and b"#" not in t[1:])
    state = g.advance(state, closing)
    assert set(g.allowed(state).tolist()) == {tok.eos_token_id} | {i for i, t in enumerate(vocab) if t.startswith(b"##")}
    assert g.finish(state, b"a#" + vocab[closing]) == Extracted("a", "a", None)


# --- the allowed sets against a brute force over the whole vocabulary ---------------------------------

# Written from the definition, apart from the module: the separator is held by a back reference.
O_AMOUNT = (
    r"(?:[0-9]+(?:[.,][0-9]+)?"
    r"|[1-9][0-9]{0,2}(?P<s>[,\u2009\u202f])[0-9]{3}(?:(?P=s)[0-9]{3})*(?:\.[0-9]+)?"
    r"|[1-9][0-9]{0,2}(?:\.[0-9]{3})+(?:,[0-9]+)?)"
)
O_NUMBER = rf" *(?:[-+\u2212]?{O_AMOUNT}%?|none)"
O_CUR = r"(?:[£$€¥₹₩₽₺]|USD|GBP|EUR|JPY|CNY|INR|KRW|RUB|TRY|AUD|CAD|CHF|NZD|HKD|SGD|SEK|NOK|DKK|PLN|ZAR|BRL|MXN|AED|SAR)"
O_WORD = r"(?:dollars?|pounds?|euros?|rupees?|yen|won|rubles?|roubles?|lira|yuan|francs?)"
O_SCALED = rf"{O_AMOUNT}(?: (?:thousand|million|billion|trillion)|k|m|bn|tn)?"
O_MONEY = rf" *(?:[-+\u2212]?(?:{O_CUR} ?{O_SCALED}|{O_SCALED} ?(?:{O_CUR}|{O_WORD}))|none)"


#: the languages' characters beyond ASCII
O_WIDE = "£€¥₹₩₽₺\u2212\u2009\u202f"


def brute_force(pattern: str, prefix: str, vocab, eos: int) -> tuple[set[int], set[int]]:
    """(ids the oracle allows after ``prefix``, ids it judged as part of a character).

    ``regex`` reads strings, so a token ending inside a multi-byte character (``b" \\xe2"``) is
    judged by its whole characters plus each character of the language its tail can begin.
    Empty tokens are never written (the definition), so never allowed.
    """
    complete = regex.fullmatch(pattern, prefix) is not None
    allowed, partial = set(), set()
    for i, t in enumerate(vocab):
        if i == eos or t.startswith(b"\n"):
            if complete:
                allowed.add(i)
            continue
        if not t:
            continue
        k = len(t)
        while True:
            try:
                head = t[:k].decode()
                break
            except UnicodeDecodeError:
                k -= 1
        tail = t[k:]
        if not tail:
            if regex.fullmatch(pattern, prefix + head, partial=True):
                allowed.add(i)
            continue
        partial.add(i)
        for c in O_WIDE:
            wide = c.encode()
            if len(tail) < len(wide) and wide.startswith(tail):
                if regex.fullmatch(pattern, prefix + head + c, partial=True):
                    allowed.add(i)
    return allowed, partial


ORACLE_CASES = [
    ("smollm2-135m", "number", O_NUMBER, ["", " 1", " 1,000"]),
    ("smollm2-135m", "money", O_MONEY, ["", " 1", " £4", " 1,000", " £2.3b", " $5 mil"]),
    ("gemma-3-270m", "money", O_MONEY, [" £4"]),
]


@pytest.mark.parametrize(("name", "kind", "pattern", "prefixes"), ORACLE_CASES)
def test_allowed_sets_match_a_brute_force_over_the_vocabulary(name, kind, pattern, prefixes):
    tok, vocab = tokenizer(name)
    eos = tok.eos_token_id
    g = TokenGrammar.build(GrammarSpec(kind), vocab, [eos])
    for prefix in prefixes:
        state = g.start
        for i in tok.encode(prefix, add_special_tokens=False):
            state = g.advance(state, i)
        expected, partial = brute_force(pattern, prefix, vocab, eos)
        assert set(g.allowed(state).tolist()) == expected, prefix
        if prefix == "":
            assert expected & partial  # the byte tokens of −, £, €, ... were judged
