"""The currencies that money extraction knows: symbols, ISO 4217 codes and words.

Read by the pack check (``currency_default`` must be one of the codes) and by the money grammar
(:mod:`spinf_stream.engine.grammar`); kept apart so a pack loads without torch.
"""

from __future__ import annotations

#: symbol -> the ISO code it determines (``$``: the pack's ``currency_default``, else USD)
SYMBOLS = {"£": "GBP", "€": "EUR", "¥": "JPY", "₹": "INR", "₩": "KRW", "₽": "RUB", "₺": "TRY", "$": None}
#: the ISO 4217 codes a money value may carry
CODES = (
    "USD GBP EUR JPY CNY INR KRW RUB TRY AUD CAD CHF NZD HKD SGD SEK NOK DKK PLN ZAR BRL MXN AED SAR"
).split()
#: currency words (after the amount only); None = the dollar, i.e. ``currency_default``
WORDS = {
    "dollar": None, "dollars": None, "pound": "GBP", "pounds": "GBP", "euro": "EUR", "euros": "EUR",
    "rupee": "INR", "rupees": "INR", "yen": "JPY", "won": "KRW", "ruble": "RUB", "rubles": "RUB",
    "rouble": "RUB", "roubles": "RUB", "lira": "TRY", "yuan": "CNY", "franc": "CHF", "francs": "CHF",
}  # fmt: skip
