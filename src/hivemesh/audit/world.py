"""The fixture world: 50 shops generated from one seed (pure, no I/O).

Theory of operation
-------------------
:func:`build_world` turns ``(seed, options)`` into a :class:`World`: a tuple
of :class:`Shop` records, each with its products, prices, currency, locale,
page layout, pagination and *behaviours* (CAPTCHA on some routes, slow, flaky,
a layout change part-way, sloppy HTML, human-only). Every choice comes from
``random.Random(f"{seed}/world")``, so one seed always gives the same world,
byte for byte; a different seed gives another one. Nothing here reads a clock
or the network: the HTTP server (:mod:`hivemesh.audit.server`) serves the
world and decides each request's fate from the seed and per-page request
counters (:meth:`World.outcome`), so a flaky page fails on exactly the same
attempts in every run.

Prices are exact: each product's price is an integer number of minor units of
its currency (:attr:`Product.minor`); :meth:`Product.price` is the decimal
text (``"1234.56"``, ``"1235"`` for yen) that the ground truth publishes.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BEHAVIOURS",
    "CURRENCY_DIGITS",
    "LAYOUTS",
    "LOCALES",
    "ROUTES",
    "Product",
    "Shop",
    "World",
    "WorldOptions",
    "build_world",
]

#: Locale -> currency of the shops written in it.
LOCALES: dict[str, str] = {
    "en-US": "USD",
    "en-GB": "GBP",
    "de-DE": "EUR",
    "fr-FR": "EUR",
    "nl-NL": "EUR",
    "de-CH": "CHF",
    "ja-JP": "JPY",
    "sv-SE": "SEK",
    "pl-PL": "PLN",
    "en-IN": "INR",
}
#: Digits after the decimal point, per currency.
CURRENCY_DIGITS = {"USD": 2, "GBP": 2, "EUR": 2, "CHF": 2, "JPY": 0, "SEK": 2, "PLN": 2, "INR": 2}
_PER_USD = {
    "USD": 1.0,
    "GBP": 0.79,
    "EUR": 0.92,
    "CHF": 0.88,
    "JPY": 151.0,
    "SEK": 10.4,
    "PLN": 3.95,
    "INR": 83.2,
}
#: How a shop lays out its price list (see :mod:`hivemesh.audit.pages`).
LAYOUTS = ("table", "cards", "jsonld", "microdata", "list")
#: Routes the fixture serves: ``direct`` (its origin port) and three proxies.
ROUTES = ("direct", "proxy-1", "proxy-2", "proxy-3")
#: Behaviours a shop may have.
BEHAVIOURS = ("captcha", "slow", "flaky", "layout-change", "sloppy-html", "human-only")
_PAGINATION = ("rel-next", "numbered", "head-link")
_ADJECTIVES = (
    "Alpine", "Amber", "Arctic", "Bold", "Brisk", "Cedar", "Coastal", "Copper", "Crimson",
    "Dusky", "Ember", "Fern", "Golden", "Granite", "Harbor", "Indigo", "Ivory", "Juniper",
    "Lunar", "Maple", "Meadow", "Misty", "Nordic", "Olive", "Onyx", "Pebble", "Polar",
    "Quartz", "Rustic", "Saffron", "Sable", "Solar", "Tidal", "Velvet", "Willow", "Zephyr",
)  # fmt: skip
_NOUNS = (
    "Backpack", "Blender", "Bookshelf", "Camera", "Candle", "Chair", "Desk Lamp", "Drone",
    "Espresso Maker", "Headphones", "Hiking Boots", "Jacket", "Kettle", "Keyboard",
    "Mattress", "Monitor", "Mug Set", "Notebook", "Rain Coat", "Router", "Scarf",
    "Smartwatch", "Sneakers", "Speaker", "Stand Mixer", "Sunglasses", "Tent", "Toaster",
    "Umbrella", "Vacuum", "Wallet", "Yoga Mat",
)  # fmt: skip
_SHOP_WORDS = (
    "Bazaar", "Corner", "Depot", "Emporium", "Goods", "House", "Market", "Outlet",
    "Store", "Supply", "Trading", "Warehouse", "Workshop",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class WorldOptions:
    """Knobs of the fixture world; the defaults give the 50-shop audit."""

    shops: int = 50
    #: Mean extra delay of a slow shop's responses.
    slow_ms: int = 1500
    #: Probability that one request to a flaky shop fails.
    flaky_rate: float = 0.35
    #: A flaky page never fails more often than this in a row.
    max_consecutive_failures: int = 2
    #: Page views served before the layout-change shop switches layout.
    layout_change_after: int = 2
    captcha_shops: int = 5
    slow_shops: int = 6
    flaky_shops: int = 8
    sloppy_shops: int = 2

    def __post_init__(self) -> None:
        special = self.captcha_shops + self.slow_shops + self.flaky_shops + self.sloppy_shops
        if not 2 + special <= self.shops <= 999:
            raise ValueError(f"need {2 + special}..999 shops for these behaviours")
        if not 0 <= self.flaky_rate < 1 or self.slow_ms < 0 or self.layout_change_after < 1:
            raise ValueError("flaky_rate in [0, 1), slow_ms >= 0, layout_change_after >= 1")


@dataclass(frozen=True, slots=True)
class Product:
    """One product: exact price in minor units of its shop's currency."""

    sku: str
    name: str
    minor: int
    #: The crossed-out "was" price of a product on sale (minor units), or 0.
    was_minor: int
    digits: int

    def price(self) -> str:
        """The price as decimal text (``"1234.56"``)."""
        return _decimal(self.minor, self.digits)

    def was(self) -> str | None:
        """The old price of a product on sale, as decimal text."""
        return _decimal(self.was_minor, self.digits) if self.was_minor else None


def _decimal(minor: int, digits: int) -> str:
    if digits == 0:
        return str(minor)
    whole, frac = divmod(minor, 10**digits)
    return f"{whole}.{frac:0{digits}d}"


@dataclass(frozen=True, slots=True)
class Shop:
    """One shop of the world (see the module docs)."""

    index: int
    id: str
    name: str
    locale: str
    currency: str
    layout: str
    #: The layout after the change (layout-change shop only).
    new_layout: str | None
    pagination: str
    #: ``?page=N`` or ``/page/N/`` links.
    path_pages: bool
    page_size: int
    products: tuple[Product, ...]
    behaviours: frozenset[str]
    #: Routes on which this shop answers with a CAPTCHA.
    captcha_routes: frozenset[str] = frozenset()
    #: Extra delay of each response (slow shops).
    delay_ms: int = 0
    theme: int = 0

    @property
    def pages(self) -> int:
        """Number of catalogue pages."""
        return max(1, math.ceil(len(self.products) / self.page_size))

    def page_products(self, page: int) -> tuple[Product, ...]:
        """The products listed on page ``page`` (1-based)."""
        return self.products[(page - 1) * self.page_size : page * self.page_size]

    def page_path(self, page: int) -> str:
        """The path of page ``page`` (without any access code)."""
        if page == 1:
            return f"/{self.id}/"
        return f"/{self.id}/page/{page}/" if self.path_pages else f"/{self.id}/?page={page}"


@dataclass(frozen=True, slots=True)
class World:
    """Every shop, plus the seed-derived secrets and outcomes."""

    seed: int
    options: WorldOptions
    shops: tuple[Shop, ...]
    _by_id: dict[str, Shop] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_id.update({s.id: s for s in self.shops})

    def shop(self, shop_id: str) -> Shop | None:
        """The shop called ``shop_id``, if any."""
        return self._by_id.get(shop_id)

    def operator_code(self) -> str:
        """The access code of the human-only shop (given to the operator, never served)."""
        h = hashlib.blake2b(f"hivemesh-fixture/{self.seed}/operator".encode(), digest_size=8)
        n = int.from_bytes(h.digest(), "big")
        return f"{n % 10_000:04d}-{n // 10_000 % 10_000:04d}"

    def outcome(self, shop: Shop, page: int, attempt: int) -> str:
        """The fate of the ``attempt``-th (0-based) request to a flaky page:
        ``"ok"`` or a failure mode (``"503"``, ``"500"``, ``"reset"``, ``"truncate"``).

        A pure function of the seed, so every run fails on the same attempts;
        never more than ``max_consecutive_failures`` failures in a row.
        """
        if "flaky" not in shop.behaviours:
            return "ok"
        opts = self.options
        run, draw, failed = 0, 0.0, False
        for n in range(attempt + 1):  # replay the page's attempts from the first
            draw = self._draw(shop, page, n)
            failed = draw < opts.flaky_rate and run < opts.max_consecutive_failures
            run = run + 1 if failed else 0
        if not failed:
            return "ok"
        return ("503", "500", "reset", "truncate")[int(draw * 1e6) % 4]

    def _draw(self, shop: Shop, page: int, attempt: int) -> float:
        key = f"hivemesh-fixture/{self.seed}/{shop.id}/{page}/{attempt}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64

    def ground_truth(self, base_url: str = "") -> dict[str, Any]:
        """What a correct extractor reads from every shop: the checking file."""
        shops: dict[str, Any] = {}
        for s in self.shops:
            shops[s.id] = {
                "name": s.name,
                "url": f"{base_url}/{s.id}/",
                "locale": s.locale,
                "currency": s.currency,
                "layout": s.layout,
                "new_layout": s.new_layout,
                "pages": s.pages,
                "behaviours": sorted(s.behaviours),
                "captcha_routes": sorted(s.captcha_routes),
                "products": [
                    {"sku": p.sku, "name": p.name, "price": p.price()} for p in s.products
                ],
            }
        return {"seed": self.seed, "base_url": base_url, "shops": shops}


def build_world(seed: int, options: WorldOptions | None = None) -> World:
    """The world of ``seed`` (see the module docs)."""
    opts = options or WorldOptions()
    rng = random.Random(f"{seed}/world")
    n = opts.shops
    order = list(range(n))
    rng.shuffle(order)
    cuts = [opts.captcha_shops, opts.slow_shops, opts.flaky_shops, opts.sloppy_shops, 1, 1]
    names = ("captcha", "slow", "flaky", "sloppy-html", "layout-change", "human-only")
    behaviour: dict[int, set[str]] = {i: set() for i in range(n)}
    pos = 0
    for name, k in zip(names, cuts, strict=True):
        for i in order[pos : pos + k]:
            behaviour[i].add(name)
        pos += k
    locales = sorted(LOCALES)
    shops: list[Shop] = []
    used_names: set[str] = set()
    for i in range(n):
        locale = locales[i % len(locales)] if i < len(locales) else rng.choice(locales)
        currency = LOCALES[locale]
        digits = CURRENCY_DIGITS[currency]
        b = frozenset(behaviour[i])
        layout = LAYOUTS[i % len(LAYOUTS)] if i < 2 * len(LAYOUTS) else rng.choice(LAYOUTS)
        new_layout = None
        count = rng.randint(5, 28)
        page_size = rng.choice((5, 8, 10, 12))
        if "layout-change" in b:  # several pages, so the change lands part-way
            layout, new_layout = "table", "cards"
            page_size, count = 5, max(count, 16)
        shop_name = _shop_name(rng, used_names)
        products = _products(rng, i, count, currency, digits)
        captcha_routes: frozenset[str] = frozenset()
        if "captcha" in b:  # always on the direct route; sometimes on one proxy too
            extra = rng.choice((None, "proxy-1", "proxy-2"))
            captcha_routes = frozenset({"direct"} | ({extra} if extra else set()))
        delay = int(opts.slow_ms * rng.uniform(0.6, 1.4)) if "slow" in b else 0
        shops.append(
            Shop(
                index=i,
                id=f"shop-{i + 1:02d}",
                name=shop_name,
                locale=locale,
                currency=currency,
                layout=layout,
                new_layout=new_layout,
                pagination=rng.choice(_PAGINATION),
                path_pages=rng.random() < 0.4,
                page_size=page_size,
                products=products,
                behaviours=b,
                captcha_routes=captcha_routes,
                delay_ms=delay,
                theme=rng.randrange(4),
            )
        )
    return World(seed=seed, options=opts, shops=tuple(shops))


def _shop_name(rng: random.Random, used: set[str]) -> str:
    while True:
        name = f"{rng.choice(_ADJECTIVES)} {rng.choice(_SHOP_WORDS)}"
        if name not in used:
            used.add(name)
            return name


def _products(
    rng: random.Random, shop: int, count: int, currency: str, digits: int
) -> tuple[Product, ...]:
    out: list[Product] = []
    names: set[str] = set()
    for k in range(count):
        while True:
            name = f"{rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
            if name not in names:
                names.add(name)
                break
        usd = rng.choice((rng.uniform(2, 60), rng.uniform(20, 400), rng.uniform(300, 2500)))
        if k == 0:
            usd = rng.uniform(1200, 4000)  # every shop shows a grouped (>= 1,000) price
        minor = max(1, round(usd * _PER_USD[currency] * 10**digits))
        if digits and rng.random() < 0.5:  # charm pricing: .99 / .95 / .00
            minor = minor // 100 * 100 + rng.choice((99, 95, 0, 49))
        was = 0
        if rng.random() < 0.2:
            was = minor + max(1, minor * rng.randint(10, 40) // 100)
        out.append(
            Product(
                sku=f"{shop + 1:02d}-{k + 1:03d}-{rng.randrange(16**4):04X}",
                name=name,
                minor=max(1, minor),
                was_minor=was,
                digits=digits,
            )
        )
    return tuple(out)
