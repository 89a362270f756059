"""Reading web pages: tables, structured data, prices, pagination, snapshots.

Theory of operation
-------------------
Pages are parsed with lxml's HTML parser (libxml2): it is fast, well kept,
and repairs what real pages send (missing end tags, unquoted attributes,
stray closers) the way browsers roughly do, so one tree serves every
extractor here. Input over :data:`MAX_HTML_BYTES` or with nothing to parse
raises :class:`~hivemesh.webtools.errors.ExtractError`; nothing else escapes.

:func:`extract_prices` runs four strategies and keeps the one that finds the
most products (ties go to the more explicit one, in this order):

``jsonld``     schema.org ``Product``/``Offer`` objects in JSON-LD (``@graph``,
               ``ItemList`` and nested lists included);
``microdata``  ``itemscope`` Products with ``itemprop="price"``;
``table``      a ``<table>`` with a price column (found by its header in
               several languages, or by its cells reading as prices);
``blocks``     repeated product blocks (cards, list items): each price's
               nearest ancestor that repeats among its siblings or looks like
               an item, with its heading or link as the name.

Crossed-out "was" prices (``<del>``, ``<s>``, ``<strike>``, classes like
``was``/``old``) are never read as the price; a price outside any product
block (a "free shipping over 50 €" banner) is not a product. Amounts come
from :func:`hivemesh.webtools.money.parse_price`.

:func:`dom_snapshot` is the parsed DOM serialised canonically (comments and
whitespace-only text dropped outside ``<pre>``, attributes sorted), so the
same DOM always gives the same bytes and hash: fit for a content-addressed
blob.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Iterator
from copy import deepcopy
from typing import Any
from urllib.parse import urljoin

import lxml.etree
import lxml.html

from hivemesh.webtools.errors import ExtractError
from hivemesh.webtools.money import Money, find_prices, parse_price

__all__ = [
    "MAX_HTML_BYTES",
    "STRATEGIES",
    "detect_block",
    "dom_snapshot",
    "extract_prices",
    "extract_structured",
    "extract_tables",
    "next_page_url",
    "page_lang",
    "parse_html",
]

#: Largest page the extractors read.
MAX_HTML_BYTES = 5 * 1024 * 1024
STRATEGIES = ("jsonld", "microdata", "table", "blocks")
_Element = Any  # lxml.html.HtmlElement (lxml ships no type stubs)

_STRUCK = {"del", "s", "strike"}
_OLD_CLASS = re.compile(r"\b(was|old|regular|strike|before|list-price)\b", re.I)
_PRICE_HEAD = re.compile(r"price|preis|prix|prijs|pris|cena|価格|precio|prezzo|cost", re.I)
_NAME_HEAD = re.compile(r"product|name|produ|artikel(?!nr)|商品|nazwa|item|title", re.I)
_SKU_HEAD = re.compile(r"sku|art\.?\s?nr|artikelnr|réf|ref\b|code|kod|品番|item no", re.I)
_ITEM_CLASS = re.compile(r"product|item|card|tile|offer|row", re.I)
_NEXT_WORDS = re.compile(
    r"^(?:(?:next|weiter|suivant|volgende|nästa|następna|siguiente|avanti|próxima)(?!\w)|次へ)",
    re.I,
)
_ARROWS = " \t\n»>→\u00bb\u203a"


def parse_html(html: str | bytes) -> _Element:
    """Parse ``html`` into an lxml tree; :class:`ExtractError` if impossible."""
    data = html.encode("utf-8", "replace") if isinstance(html, str) else html
    if len(data) > MAX_HTML_BYTES:
        raise ExtractError(f"page over {MAX_HTML_BYTES} bytes")
    if not data.strip():
        raise ExtractError("empty document")
    parser = lxml.html.HTMLParser(encoding="utf-8", remove_comments=True)
    try:
        doc = lxml.html.document_fromstring(data, parser=parser)
    except (lxml.etree.ParserError, ValueError, lxml.etree.XMLSyntaxError) as exc:
        raise ExtractError(f"unparseable HTML: {exc}") from None
    if doc is None or (doc.find("body") is None and not len(doc)):
        raise ExtractError("no document element")
    return doc


def page_lang(doc: _Element) -> str:
    """The page's language (``<html lang>``), ``"en"`` when absent."""
    lang = str(doc.get("lang") or "").strip()
    return lang or "en"


def _text(el: _Element) -> str:
    return " ".join(str(el.text_content()).split())


def _current_text(el: _Element) -> str:
    """``el``'s text without crossed-out "was" prices."""
    parts: list[str] = []

    def walk(node: _Element) -> None:
        tag = node.tag if isinstance(node.tag, str) else ""
        if tag.lower() in _STRUCK or _OLD_CLASS.search(str(node.get("class") or "")):
            if node.tail:
                parts.append(node.tail)
            return
        if tag.lower() in ("script", "style"):
            return
        if node.text:
            parts.append(node.text)
        for child in node:
            walk(child)
        if node.tail and node is not el:
            parts.append(node.tail)

    walk(el)
    return " ".join(" ".join(parts).split())


# -- tables -------------------------------------------------------------------


def _rows(table: _Element) -> Iterator[list[_Element]]:
    for tr in table.iter("tr"):
        if tr.getparent() is not None and _owner_table(tr) is table:
            yield [c for c in tr if isinstance(c.tag, str) and c.tag.lower() in ("td", "th")]


def _owner_table(el: _Element) -> _Element:
    p = el.getparent()
    while p is not None and (not isinstance(p.tag, str) or p.tag.lower() != "table"):
        p = p.getparent()
    return p


def extract_tables(doc: _Element, *, max_tables: int = 50) -> list[dict[str, Any]]:
    """Every table as ``{"caption", "headers", "rows"}`` (cell texts)."""
    out: list[dict[str, Any]] = []
    for table in doc.iter("table"):
        if len(out) >= max_tables:
            break
        rows = list(_rows(table))
        headers: list[str] = []
        if rows and all(c.tag.lower() == "th" for c in rows[0]):
            headers = [_text(c) for c in rows[0]]
            rows = rows[1:]
        cap = table.find("caption")
        out.append(
            {
                "caption": _text(cap) if cap is not None else "",
                "headers": headers,
                "rows": [[_text(c) for c in r] for r in rows if r],
            }
        )
    return out


# -- structured data --------------------------------------------------------------


def _jsonld_objects(doc: _Element) -> list[Any]:
    out = []
    for script in doc.iter("script"):
        if str(script.get("type") or "").strip().lower() != "application/ld+json":
            continue
        try:
            out.append(json.loads(script.text or ""))
        except ValueError:
            continue  # a broken block does not hide the others
    return out


def _microdata_item(el: _Element) -> dict[str, Any]:
    props: dict[str, Any] = {}

    def walk(node: _Element) -> None:
        for child in node:
            if not isinstance(child.tag, str):
                continue
            prop = child.get("itemprop")
            if prop:
                if child.get("itemscope") is not None:
                    value: Any = _microdata_item(child)
                else:
                    value = child.get("content") or child.get("href") or _text(child)
                props.setdefault(prop, value)
            if child.get("itemscope") is None:
                walk(child)

    walk(el)
    return {"@type": str(el.get("itemtype") or ""), **props}


def _microdata(doc: _Element) -> list[dict[str, Any]]:
    return [
        _microdata_item(el)
        for el in doc.iter()
        if isinstance(el.tag, str) and el.get("itemscope") is not None and not el.get("itemprop")
    ]


def extract_structured(doc: _Element) -> dict[str, list[Any]]:
    """JSON-LD blocks and top-level microdata items."""
    return {"jsonld": _jsonld_objects(doc), "microdata": _microdata(doc)}


# -- prices ------------------------------------------------------------------------


def _product(name: Any, sku: Any, money: Money | None, how: str) -> dict[str, Any] | None:
    if money is None or not isinstance(name, str) or not name.strip():
        return None
    return {
        "name": " ".join(name.split()),
        "sku": str(sku).strip() if isinstance(sku, (str, int)) and str(sku).strip() else None,
        "price": money.amount,
        "currency": money.currency,
        "source": how,
    }


def _walk_ld(obj: Any, depth: int = 0) -> Iterator[dict[str, Any]]:
    if depth > 12:
        return
    if isinstance(obj, list):
        for x in obj:
            yield from _walk_ld(x, depth + 1)
    elif isinstance(obj, dict):
        t = obj.get("@type")
        types = t if isinstance(t, list) else [t]
        if "Product" in types:
            yield obj
            return
        for key in ("@graph", "itemListElement", "item", "mainEntity", "hasVariant"):
            if key in obj:
                yield from _walk_ld(obj[key], depth + 1)


def _from_jsonld(doc: _Element, lang: str) -> list[dict[str, Any]]:
    out = []
    for product in _walk_ld(_jsonld_objects(doc)):
        offers = product.get("offers")
        offer = offers[0] if isinstance(offers, list) and offers else offers
        if not isinstance(offer, dict):
            continue
        price = offer.get("price", offer.get("lowPrice"))
        cur = offer.get("priceCurrency")
        money = (
            parse_price(str(price), lang="en", currency=cur if isinstance(cur, str) else None)
            if isinstance(price, (str, int, float)) and not isinstance(price, bool)
            else None
        )
        p = _product(product.get("name"), product.get("sku"), money, "jsonld")
        if p is not None:
            out.append(p)
    return out


def _from_microdata(doc: _Element, lang: str) -> list[dict[str, Any]]:
    out = []
    for item in _microdata(doc):
        if not item["@type"].rstrip("/").endswith("Product"):
            continue
        offer = item.get("offers")
        src = offer if isinstance(offer, dict) else item
        price, cur = src.get("price"), src.get("priceCurrency")
        money = None
        if isinstance(price, str):
            c = cur if isinstance(cur, str) else None
            money = parse_price(
                price, lang="en" if re.fullmatch(r"[\d.]+", price) else lang, currency=c
            )
        p = _product(item.get("name"), item.get("sku"), money, "microdata")
        if p is not None:
            out.append(p)
    return out


def _column(headers: list[str], pattern: re.Pattern[str]) -> int | None:
    for i, h in enumerate(headers):
        if pattern.search(h):
            return i
    return None


def _from_tables(doc: _Element, lang: str) -> list[dict[str, Any]]:
    best: list[dict[str, Any]] = []
    for table in doc.iter("table"):
        rows = list(_rows(table))
        if not rows:
            continue
        headers = [_text(c) for c in rows[0]] if all(c.tag.lower() == "th" for c in rows[0]) else []
        body = rows[1:] if headers else rows
        price_col = _column(headers, _PRICE_HEAD)
        if price_col is None:  # the column whose cells read as prices most often
            width = max((len(r) for r in body), default=0)
            scores = [
                sum(1 for r in body if len(r) > i and find_prices(_current_text(r[i]), lang=lang))
                for i in range(width)
            ]
            if not scores or max(scores) == 0:
                continue
            price_col = scores.index(max(scores))
        name_col = _column(headers, _NAME_HEAD)
        sku_col = _column(headers, _SKU_HEAD)
        if name_col is None:
            name_col = next(
                (i for i in range(len(headers) or 1) if i not in (price_col, sku_col)), 0
            )
        found = []
        for r in body:
            if len(r) <= max(price_col, name_col):
                continue
            prices = find_prices(_current_text(r[price_col]), lang=lang)
            sku = _text(r[sku_col]) if sku_col is not None and len(r) > sku_col else None
            p = _product(_text(r[name_col]), sku, prices[-1] if prices else None, "table")
            if p is not None:
                found.append(p)
        if len(found) > len(best):
            best = found
    return best


def _struck(el: _Element) -> bool:
    """Whether ``el`` is (inside) a crossed-out "was" price."""
    for node in (el, *el.iterancestors()):
        tag = node.tag.lower() if isinstance(node.tag, str) else ""
        if tag in _STRUCK or _OLD_CLASS.search(str(node.get("class") or "")):
            return True
    return False


def _is_block(el: _Element) -> bool:
    tag = el.tag.lower() if isinstance(el.tag, str) else ""
    if tag in ("li", "tr", "article") or el.get("data-sku") or el.get("itemscope") is not None:
        return True
    if _ITEM_CLASS.search(str(el.get("class") or "")):
        return True
    parent = el.getparent()
    if parent is None:
        return False
    sig = (tag, el.get("class"))
    return (
        sum(1 for c in parent if isinstance(c.tag, str) and (c.tag.lower(), c.get("class")) == sig)
        > 1
    )


def _block_name(block: _Element) -> str | None:
    for el in block.iter():
        if not isinstance(el.tag, str):
            continue
        tag = el.tag.lower()
        cls = str(el.get("class") or "")
        if tag in ("h1", "h2", "h3", "h4", "h5", "h6") or re.search(r"\b(name|title)\b", cls):
            text = _text(el)
            if text:
                return text
    for a in block.iter("a"):
        text = _text(a)
        if text and not find_prices(text):
            return text
    return None


def _block_sku(block: _Element) -> str | None:
    if block.get("data-sku"):
        return str(block.get("data-sku"))
    for el in block.iter():
        if isinstance(el.tag, str) and (
            el.get("data-sku") or re.search(r"\bsku\b", str(el.get("class") or ""))
        ):
            return str(el.get("data-sku") or _text(el))
    return None


def _from_blocks(doc: _Element, lang: str) -> list[dict[str, Any]]:
    body = doc.find("body")
    if body is None:
        return []
    blocks: dict[_Element, None] = {}
    stops = {"body", "main", "header", "footer", "nav", "html"}
    for el in body.iter():
        if not isinstance(el.tag, str) or el.tag.lower() in _STRUCK:
            continue
        # the element's own text: its text and the tails of its children
        own = " ".join(t for t in (el.text, *(c.tail for c in el)) if t)
        if not own or not find_prices(own, lang=lang):
            continue
        node = el
        while node is not None and node.tag.lower() not in stops and not _is_block(node):
            node = node.getparent()
        if node is None or node.tag.lower() in stops:
            continue
        if not _struck(el):
            blocks.setdefault(node, None)
    out = []
    for block in blocks:
        prices = find_prices(_current_text(block), lang=lang)
        if len(prices) != 1:
            continue  # a block is one product with one current price
        p = _product(_block_name(block), _block_sku(block), prices[0], "blocks")
        if p is not None:
            out.append(p)
    return out


_RUNNERS = {
    "jsonld": _from_jsonld,
    "microdata": _from_microdata,
    "table": _from_tables,
    "blocks": _from_blocks,
}


def extract_prices(doc: _Element, *, strategy: str = "auto") -> dict[str, Any]:
    """The products and prices of a page: ``{"strategy", "currency",
    "products": [{"name", "sku", "price", "currency", "source"}]}``.

    ``strategy`` is one of :data:`STRATEGIES` or ``"auto"`` (the one that
    finds most products). Products are de-duplicated by SKU (else name).
    """
    if strategy != "auto" and strategy not in _RUNNERS:
        raise ExtractError(f"unknown strategy {strategy!r}; one of auto, {', '.join(STRATEGIES)}")
    lang = page_lang(doc)
    names = STRATEGIES if strategy == "auto" else (strategy,)
    best_name, best = names[0], list[dict[str, Any]]()
    for name in names:
        found = _RUNNERS[name](doc, lang)
        if len(found) > len(best):
            best_name, best = name, found
    seen: set[str] = set()
    products = []
    for p in best:
        key = p["sku"] or p["name"]
        if key not in seen:
            seen.add(key)
            products.append(p)
    currencies = sorted({p["currency"] for p in products if p["currency"]})
    return {
        "strategy": best_name,
        "currency": currencies[0] if len(currencies) == 1 else None,
        "products": products,
    }


# -- navigation and blocks --------------------------------------------------------


def _navigable(href: Any) -> bool:
    """A link to another page (not an in-page anchor or a script)."""
    h = str(href or "").strip()
    return bool(h) and not h.startswith("#") and not h.lower().startswith("javascript:")


def next_page_url(doc: _Element, base_url: str) -> str | None:
    """The URL of the next page (``rel=next``, a "next" link in many
    languages, or the number after the current one), absolute."""
    base = base_url
    b = doc.find(".//base[@href]")
    if b is not None:
        base = urljoin(base_url, str(b.get("href")))
    candidates: list[str] = []
    for el in doc.iter("link", "a"):
        rel = str(el.get("rel") or "").lower().split()
        if "next" in rel and _navigable(el.get("href")):
            candidates.append(str(el.get("href")))
    if not candidates:
        for a in doc.iter("a"):
            href = a.get("href")
            if not _navigable(href):
                continue
            cls = str(a.get("class") or "") + " " + str(a.get("aria-label") or "")
            label = _text(a).strip(_ARROWS)
            if re.search(r"\bnext\b", cls, re.I) or (label and _NEXT_WORDS.match(label)):
                candidates.append(str(href))
                break
    if not candidates:
        current = None
        for el in doc.iter():
            marked = isinstance(el.tag, str) and (
                el.get("aria-current") == "page" or "current" in str(el.get("class") or "").split()
            )
            if marked and _text(el).isdigit():
                current = int(_text(el))
                break
        if current is not None:
            for a in doc.iter("a"):
                if _text(a) == str(current + 1) and _navigable(a.get("href")):
                    candidates.append(str(a.get("href")))
                    break
    return urljoin(base, candidates[0]) if candidates else None


_CAPTCHA_MARK = re.compile(r"captcha|recaptcha|hcaptcha|cf-challenge|challenge-form", re.I)
_CAPTCHA_TEXT = re.compile(r"verify (that )?you are (a )?human|are you a robot|just a moment", re.I)


def detect_block(doc: _Element) -> str | None:
    """``"captcha"`` for a challenge page, ``"access_code"`` for a page that
    asks for an access code, else ``None``. A page that lists products is
    never a challenge, even with a CAPTCHA widget in some form on it."""
    title = doc.find(".//title")
    body_text = _text(doc)[:2000]
    marked = any(
        isinstance(el.tag, str)
        and _CAPTCHA_MARK.search(f"{el.get('id') or ''} {el.get('class') or ''}")
        for el in doc.iter()
    )
    if marked or _CAPTCHA_TEXT.search(
        (_text(title) if title is not None else "") + " " + body_text
    ):
        return None if extract_prices(doc)["products"] else "captcha"
    asks = re.search(r"access code|zugangscode|code d'accès", body_text, re.I)
    for inp in doc.iter("input"):
        if asks and str(inp.get("name") or "").lower() in ("code", "access_code", "accesscode"):
            return "access_code"
    return None


def _canonical(el: _Element) -> None:
    for node in el.iter():
        if not isinstance(node.tag, str):
            continue
        if node.attrib:
            items = sorted(node.attrib.items())
            node.attrib.clear()
            for k, v in items:
                # an attribute name with control characters parses but cannot
                # be written back (lxml refuses it): it is left out of the
                # snapshot rather than failing it (found by hivemesh fuzz)
                with contextlib.suppress(ValueError):
                    node.set(k, v)
        keep = node.tag.lower() in ("pre", "textarea") or any(
            a.tag in ("pre", "textarea") for a in node.iterancestors()
        )
        if not keep:
            if node.text is not None and not node.text.strip():
                node.text = None
            if node.tail is not None and not node.tail.strip():
                node.tail = None


def dom_snapshot(doc: _Element) -> tuple[str, str]:
    """``(normalised HTML, sha256 hex of its UTF-8 bytes)`` of the parsed DOM."""
    copy = deepcopy(doc)
    _canonical(copy)
    body = lxml.html.tostring(copy, encoding="unicode", method="html")
    text = "<!DOCTYPE html>\n" + body
    return text, hashlib.sha256(text.encode("utf-8")).hexdigest()
