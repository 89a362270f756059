"""HTML of the fixture shops: price tables, product cards, JSON-LD, microdata,
plain lists; localised prices and labels; three pagination styles; the
CAPTCHA, access-code and index pages.

Pure functions of a :class:`~hivemesh.audit.world.Shop` and a page number, so
the same world always serves the same bytes. The markup imitates what real
shops send (wrappers, promos with prices that are not products, crossed-out
"was" prices, prices only in JSON-LD while the visible ones wait for a
script); a correct extractor reads exactly the ground truth from it.
"""

from __future__ import annotations

import html
import json
import re

from hivemesh.audit.world import CURRENCY_DIGITS, Product, Shop, World

__all__ = [
    "captcha_page",
    "code_page",
    "format_price",
    "index_page",
    "shop_page",
]

_NBSP, _NNBSP, _APOS = "\u00a0", "\u202f", "\u2019"

_LABELS = {
    "en": ("Product", "SKU", "Price", "Next", "Previous", "Page", "products", "Free shipping over"),
    "de": ("Produkt", "Artikelnr.", "Preis", "Weiter", "Zurück", "Seite", "Artikel",
           "Versandkostenfrei ab"),
    "fr": ("Produit", "Réf.", "Prix", "Suivant", "Précédent", "Page", "produits",
           "Livraison offerte dès"),
    "nl": ("Product", "Artikelnr.", "Prijs", "Volgende", "Vorige", "Pagina", "producten",
           "Gratis verzending vanaf"),
    "ja": ("商品", "品番", "価格", "次へ", "前へ", "ページ", "件", "送料無料"),
    "sv": ("Produkt", "Art.nr", "Pris", "Nästa", "Föregående", "Sida", "produkter",
           "Fri frakt över"),
    "pl": ("Produkt", "Kod", "Cena", "Następna", "Poprzednia", "Strona", "produktów",
           "Darmowa dostawa od"),
}  # fmt: skip


def _group(whole: str, sep: str, indian: bool = False) -> str:
    if indian and len(whole) > 3:
        head, tail = whole[:-3], whole[-3:]
        parts: list[str] = []
        while len(head) > 2:
            parts.insert(0, head[-2:])
            head = head[:-2]
        if head:
            parts.insert(0, head)
        return sep.join([*parts, tail])
    parts = []
    while len(whole) > 3:
        parts.insert(0, whole[-3:])
        whole = whole[:-3]
    parts.insert(0, whole)
    return sep.join(parts)


def format_price(decimal_text: str, locale: str) -> str:
    """``"1234.56"`` as a shop in ``locale`` writes it (``"1.234,56 €"``)."""
    whole, _, frac = decimal_text.partition(".")
    if locale == "en-US":
        return f"${_group(whole, ',')}.{frac}"
    if locale == "en-GB":
        return f"£{_group(whole, ',')}.{frac}"
    if locale == "de-DE":
        return f"{_group(whole, '.')},{frac}{_NBSP}€"
    if locale == "fr-FR":
        return f"{_group(whole, _NNBSP)},{frac}{_NBSP}€"
    if locale == "nl-NL":
        return f"€{_NBSP}{_group(whole, '.')},{frac}"
    if locale == "de-CH":
        return f"CHF{_NBSP}{_group(whole, _APOS)}.{frac}"
    if locale == "ja-JP":
        return f"{_group(whole, ',')}円"
    if locale == "sv-SE":
        return f"{_group(whole, _NBSP)},{frac}{_NBSP}kr"
    if locale == "pl-PL":
        return f"{_group(whole, _NBSP)},{frac}{_NBSP}zł"
    if locale == "en-IN":
        return f"₹{_group(whole, ',', indian=True)}.{frac}"
    raise ValueError(f"no price format for {locale}")


def _labels(shop: Shop) -> tuple[str, ...]:
    return _LABELS.get(shop.locale.split("-")[0], _LABELS["en"])


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _href(shop: Shop, page: int, code: str | None) -> str:
    path = shop.page_path(page)
    if code is None:
        return path if shop.path_pages or page == 1 else f"?page={page}"
    sep = "&" if "?" in path else "?"
    return f"{path}{sep}code={code}"


def _price_html(p: Product, shop: Shop, was_tag: str, now_tag: str) -> str:
    now = _e(format_price(p.price(), shop.locale))
    was = p.was()
    if was is None:
        return f"<{now_tag}>{now}</{now_tag.split()[0]}>"
    old = _e(format_price(was, shop.locale))
    return f"<{was_tag}>{old}</{was_tag.split()[0]}> <{now_tag}>{now}</{now_tag.split()[0]}>"


def _table(shop: Shop, products: tuple[Product, ...], classes: str) -> str:
    lab = _labels(shop)
    rows = "".join(
        f'<tr class="row"><td class="name">{_e(p.name)}</td><td class="sku">{_e(p.sku)}</td>'
        f'<td class="price">{_price_html(p, shop, "s", "span")}</td></tr>'
        for p in products
    )
    return (
        f'<table class="{classes}"><caption>{_e(shop.name)}</caption><thead><tr>'
        f"<th>{lab[0]}</th><th>{lab[1]}</th><th>{lab[2]}</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


_WAS, _NOW = 'span class="was"', 'span class="now"'


def _cards(shop: Shop, products: tuple[Product, ...], changed: bool) -> str:
    card, title = ("tile", "tile__title") if changed else ("product-card", "title")
    items = "".join(
        f'<article class="{card}" data-sku="{_e(p.sku)}"><a href="#{_e(p.sku)}">'
        f'<h3 class="{title}">{_e(p.name)}</h3></a><div class="meta">'
        f'<span class="rating">4.{len(p.name) % 10} ★</span></div><div class="pricing">'
        f"{_price_html(p, shop, _WAS, _NOW)}</div>"
        f'<button class="add">+</button></article>'
        for p in products
    )
    return f'<section class="grid">{items}</section>'


def _jsonld(shop: Shop, products: tuple[Product, ...], page: int) -> str:
    items = [
        {
            "@type": "Product",
            "name": p.name,
            "sku": p.sku,
            "offers": {
                "@type": "Offer",
                "price": p.price(),
                "priceCurrency": shop.currency,
                "availability": "https://schema.org/InStock",
            },
        }
        for p in products
    ]
    if shop.theme % 2:
        data: object = {"@context": "https://schema.org", "@graph": items}
    else:
        data = {
            "@context": "https://schema.org",
            "@type": "ItemList",
            "itemListElement": [
                {"@type": "ListItem", "position": (page - 1) * shop.page_size + k + 1, "item": it}
                for k, it in enumerate(items)
            ],
        }
    visible = "".join(
        f'<li class="item"><span class="n">{_e(p.name)}</span> '
        f'<span class="price" data-loading="1">…</span></li>'
        for p in products
    )
    text = json.dumps(data, ensure_ascii=False, indent=1).replace("</", "<\\/")
    return f'<script type="application/ld+json">{text}</script><ul class="items">{visible}</ul>'


def _microdata(shop: Shop, products: tuple[Product, ...]) -> str:
    items = "".join(
        f'<div class="p" itemscope itemtype="https://schema.org/Product">'
        f'<h2 itemprop="name">{_e(p.name)}</h2><meta itemprop="sku" content="{_e(p.sku)}">'
        f'<div itemprop="offers" itemscope itemtype="https://schema.org/Offer">'
        f'<meta itemprop="priceCurrency" content="{shop.currency}">'
        + (f"<del>{_e(format_price(p.was() or '', shop.locale))}</del> " if p.was() else "")
        + f'<span itemprop="price" content="{p.price()}">'
        f"{_e(format_price(p.price(), shop.locale))}</span></div></div>"
        for p in products
    )
    return f'<div class="catalogue">{items}</div>'


def _list(shop: Shop, products: tuple[Product, ...]) -> str:
    items = "".join(
        f'<li data-sku="{_e(p.sku)}"><a href="#p{k}">{_e(p.name)}</a> — '
        f"{_price_html(p, shop, 'del', 'strong')}</li>"
        for k, p in enumerate(products)
    )
    return f'<ul class="catalogue">{items}</ul>'


def _pagination(shop: Shop, page: int, code: str | None) -> tuple[str, str]:
    """``(head links, body navigation)``."""
    lab = _labels(shop)
    last = shop.pages
    if last == 1:
        return "", ""
    nxt = _e(_href(shop, page + 1, code)) if page < last else None
    prv = _e(_href(shop, page - 1, code)) if page > 1 else None
    if shop.pagination == "rel-next":
        body = (f'<a rel="prev" href="{prv}">\u2039 {lab[4]}</a> ' if prv else "") + (
            f'<a rel="next" href="{nxt}">{lab[3]} \u203a</a>' if nxt else ""
        )
        return "", f'<div class="pager">{body}</div>'
    if shop.pagination == "numbered":
        nums = "".join(
            f'<span class="current">{n}</span>'
            if n == page
            else f'<a href="{_e(_href(shop, n, code))}">{n}</a>'
            for n in range(1, last + 1)
        )
        more = f'<a class="next" href="{nxt}">{lab[3]} »</a>' if nxt else ""
        return "", f'<nav class="pagination" aria-label="{lab[5]}">{nums}{more}</nav>'
    head = (f'<link rel="prev" href="{prv}">' if prv else "") + (
        f'<link rel="next" href="{nxt}">' if nxt else ""
    )
    button = f'<button class="load-more" data-page="{page + 1}">…</button>' if nxt else ""
    return head, button


def shop_page(world: World, shop: Shop, page: int, *, changed: bool, code: str | None) -> str:
    """Page ``page`` of ``shop`` (``changed``: after its layout change;
    ``code``: the access code, repeated in its links)."""
    lab = _labels(shop)
    products = shop.page_products(page)
    layout = shop.new_layout if changed and shop.new_layout else shop.layout
    if layout == "table":
        body = _table(shop, products, "prices striped" if shop.theme % 2 else "price-list")
    elif layout == "cards":
        body = _cards(shop, products, changed)
    elif layout == "jsonld":
        body = _jsonld(shop, products, page)
    elif layout == "microdata":
        body = _microdata(shop, products)
    else:
        body = _list(shop, products)
    head_links, nav = _pagination(shop, page, code)
    promo = ""
    if shop.theme in (1, 3):
        free = format_price("50.00" if CURRENCY_DIGITS[shop.currency] else "5000", shop.locale)
        promo = f'<div class="promo">{lab[7]} {_e(free)}</div>'
    title = f"{shop.name} \u2013 {lab[5]} {page}" if page > 1 else shop.name
    doc = (
        f'<!DOCTYPE html>\n<html lang="{shop.locale}"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title>"
        f'<link rel="canonical" href="{_e(shop.page_path(page))}">{head_links}</head>'
        f'<body class="theme-{shop.theme}"><header><a class="logo" href="/">{_e(shop.name)}</a>'
        f"{promo}</header><main><h1>{_e(shop.name)}</h1>"
        f'<p class="count">{len(shop.products)} {lab[6]} · {lab[5]} {page}/{shop.pages}</p>'
        f"{body}{nav}</main>"
        f'<footer>© 2026 {_e(shop.name)} · <a href="/">All shops</a></footer></body></html>\n'
    )
    return _sloppify(doc) if "sloppy-html" in shop.behaviours else doc


_QUOTED = re.compile(r'(\s[a-z-]+)="([A-Za-z0-9_-]+)"')


def _sloppify(doc: str) -> str:
    """What careless templates send: optional end tags dropped, attributes
    unquoted, upper-case tags, an unclosed ``<b>`` and stray end tags."""
    doc = doc.replace("</td>", "").replace("</li>", "").replace("</p>", "")
    doc = _QUOTED.sub(r"\1=\2", doc)
    doc = doc.replace("<table", "<TABLE").replace("</table>", "</TABLE>")
    doc = doc.replace("<header>", "<header><b>", 1)
    return doc.replace("<footer>", "</span></div><footer>", 1)


def captcha_page(shop: Shop) -> str:
    """The challenge a shop answers with on a route it distrusts."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>Just a moment...</title></head><body>"
        '<div id="challenge" class="captcha"><h1>Please verify you are a human</h1>'
        f"<p>{_e(shop.name)} needs to check your connection before you can continue.</p>"
        '<form id="captcha-form" method="post"><div class="g-recaptcha" '
        f'data-sitekey="fixture-{shop.id}"></div><button>Verify</button></form></div>'
        "</body></html>\n"
    )


def code_page(shop: Shop, *, wrong: bool) -> str:
    """The page of the human-only shop without (or with a wrong) access code."""
    why = "That access code is not valid." if wrong else "This price list is private."
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(shop.name)} \u2013 access code required</title></head><body>"
        f'<main class="access-code-required"><h1>{_e(shop.name)}</h1><p>{why} '
        "Ask your operator for the access code, then open this page with "
        f"<code>?code=&lt;access code&gt;</code> (for example <code>/{shop.id}/?code=0000-0000"
        '</code>).</p><form method="get"><input name="code" placeholder="0000-0000">'
        "<button>Open</button></form></main></body></html>\n"
    )


def index_page(world: World) -> str:
    """The directory of every shop."""
    items = "".join(
        f'<li><a href="/{s.id}/">{_e(s.name)}</a> <small>{s.locale}</small></li>'
        for s in world.shops
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>Shops</title>'
        f'</head><body><h1>{len(world.shops)} shops</h1><ul class="shops">{items}</ul>'
        "</body></html>\n"
    )
