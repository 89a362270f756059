"""Reading prices as shops write them, in any common locale.

:func:`parse_price` turns ``"1.234,56 €"``, ``"CHF 1'234.50"``,
``"₹1,23,456.00"``, ``"12 345,00 zł"`` or ``"1,235円"`` into exact decimal
text and an ISO 4217 currency code, without being told the locale: the
decimal separator is the last of ``.``/``,`` when both appear, a separator
that repeats is a group separator, and a single separator followed by exactly
three digits is read by the page's language (``lang`` hint: ``de``, ``fr``
... group with ``.``; ``en``, ``ja`` ... with ``,``). Amounts are quantised to
the currency's minor unit (``JPY`` has none). It never guesses a currency it
does not see: a bare number has currency ``None`` unless a default is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

__all__ = ["Money", "find_prices", "minor_digits", "parse_price"]

_SYMBOLS: tuple[tuple[str, str], ...] = (
    ("CHF", "CHF"),
    ("US$", "USD"),
    ("zł", "PLN"),
    ("Kč", "CZK"),
    ("kr", "SEK"),
    ("R$", "BRL"),
    ("€", "EUR"),
    ("£", "GBP"),
    ("₹", "INR"),
    ("円", "JPY"),
    ("￥", "JPY"),
    ("¥", "JPY"),
    ("$", "USD"),
)
_CODES = frozenset(
    ("USD", "EUR", "GBP", "JPY", "CHF", "SEK", "NOK", "DKK", "PLN", "INR", "CZK", "BRL", "CAD")
)
_ZERO_DIGIT = frozenset({"JPY", "KRW", "HUF", "ISK", "CLP", "VND"})
#: Languages whose shops write ``1.234,56`` (a lone ``.`` + 3 digits groups).
_COMMA_DECIMAL = frozenset(
    ("de", "fr", "nl", "sv", "pl", "it", "es", "pt", "da", "nb", "no", "fi", "cs", "ru", "tr")
)
_KR_BY_LANG = {"nb": "NOK", "no": "NOK", "da": "DKK", "sv": "SEK"}
_DOLLAR_BY_LANG = {"en-CA": "CAD", "fr-CA": "CAD", "en-AU": "AUD"}
_SPACES = re.compile(r"[\s\u00a0\u202f\u2009\u2007]+")
_NUMBER = re.compile(r"\d[\d.,'\u2019\s\u00a0\u202f\u2009]*\d|\d")
#: A price-looking run: currency, number, currency (either side optional).
_PRICE_RUN = re.compile(
    r"(?:(?:CHF|US\$|R\$|[A-Z]{3}|[€£₹¥￥$])[\s\u00a0\u202f]*)?"
    r"\d[\d.,'\u2019\u00a0\u202f\u2009 ]*\d?"
    r"(?:[\s\u00a0\u202f]*(?:€|zł|Kč|kr|円|CHF|[A-Z]{3}))?"
)


@dataclass(frozen=True, slots=True)
class Money:
    """An exact amount: decimal text (``"1234.56"``) and an ISO 4217 code."""

    amount: str
    currency: str | None

    def decimal(self) -> Decimal:
        """The amount as a :class:`~decimal.Decimal`."""
        return Decimal(self.amount)


def minor_digits(currency: str | None) -> int:
    """Digits of the currency's minor unit (2 unless it has none)."""
    return 0 if currency in _ZERO_DIGIT else 2


def _currency(text: str, lang: str) -> tuple[str | None, str]:
    """The currency found in ``text`` and ``text`` without it."""
    for code in sorted(_CODES):
        if re.search(rf"(?<![A-Za-z]){code}(?![A-Za-z])", text):
            return code, re.sub(rf"(?<![A-Za-z]){code}(?![A-Za-z])", " ", text)
    for symbol, code in _SYMBOLS:
        if symbol in text:
            if symbol == "kr":
                code = _KR_BY_LANG.get(lang.split("-")[0], "SEK")
            elif symbol == "$":
                code = _DOLLAR_BY_LANG.get(lang, "USD")
            return code, text.replace(symbol, " ")
    return None, text


def _number(text: str, lang: str) -> str | None:
    m = _NUMBER.search(text)
    if m is None:
        return None
    raw = _SPACES.sub("", m.group(0)).replace("'", "").replace("\u2019", "")
    dots, commas = raw.count("."), raw.count(",")
    if dots and commas:
        dec = "." if raw.rfind(".") > raw.rfind(",") else ","
    elif dots + commas == 0:
        return raw
    else:
        sep = "." if dots else ","
        tail = raw.rsplit(sep, 1)[1]
        if raw.count(sep) > 1:
            dec = None
        elif len(tail) != 3:
            dec = sep
        else:  # "1.234" or "1,234": the language decides
            comma_lang = lang.split("-")[0] in _COMMA_DECIMAL
            dec = None if (sep == "." and comma_lang) or (sep == "," and not comma_lang) else sep
    group = {".", ","} - ({dec} if dec else set())
    for g in group:
        raw = raw.replace(g, "")
    if dec == ",":
        raw = raw.replace(",", ".")
    return raw


def parse_price(text: str, *, lang: str = "en", currency: str | None = None) -> Money | None:
    """The price written in ``text``, or ``None`` if there is none.

    ``currency`` is the default when the text shows none (a JSON-LD
    ``priceCurrency``); a currency the text does show wins.
    """
    if not text or len(text) > 200:
        return None
    found, rest = _currency(text, lang)
    number = _number(rest, lang)
    if number is None:
        return None
    cur = found or currency
    try:
        value = Decimal(number)
    except InvalidOperation:
        return None
    digits = minor_digits(cur)
    q = value.quantize(Decimal(1).scaleb(-digits)) if digits else value.quantize(Decimal(1))
    return Money(f"{q:f}", cur)


def find_prices(text: str, *, lang: str = "en") -> list[Money]:
    """Every price with a visible currency in ``text`` (a bare number is not a price)."""
    out = []
    for m in _PRICE_RUN.finditer(text):
        money = parse_price(m.group(0), lang=lang)
        if money is not None and money.currency is not None:
            out.append(money)
    return out
