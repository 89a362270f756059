"""The web tools: price parsing, extractors, and the MCP server driven by the
official mcp client over stdio and streamable HTTP against the fixture."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client, StdioServerParameters

import hivemesh
from hivemesh.audit.pages import format_price
from hivemesh.audit.server import FixtureServer, serve_in_thread
from hivemesh.audit.world import CURRENCY_DIGITS, LOCALES, WorldOptions, build_world
from hivemesh.core.views.blobs import blob_digest
from hivemesh.webtools.errors import ExtractError
from hivemesh.webtools.extract import (
    detect_block,
    dom_snapshot,
    extract_prices,
    extract_tables,
    next_page_url,
    parse_html,
)
from hivemesh.webtools.money import parse_price

SRC = str(Path(hivemesh.__file__).resolve().parent.parent)


@settings(max_examples=300, deadline=None)
@given(locale=st.sampled_from(sorted(LOCALES)), minor=st.integers(1, 10**9))
def test_prices_read_back_in_every_locale(locale: str, minor: int) -> None:
    cur = LOCALES[locale]
    digits = CURRENCY_DIGITS[cur]
    text = str(minor) if digits == 0 else f"{minor // 100}.{minor % 100:02d}"
    money = parse_price(format_price(text, locale), lang=locale)
    assert money is not None and (money.amount, money.currency) == (text, cur)


@pytest.mark.parametrize(
    ("text", "lang", "amount", "currency"),
    [
        ("$1,234.56", "en", "1234.56", "USD"),
        ("1.234 €", "de", "1234.00", "EUR"),
        ("1,234 €", "de", "1.23", "EUR"),
        ("EUR 12", "en", "12.00", "EUR"),
        ("12,5 kr", "nb", "12.50", "NOK"),
        ("¥ 1,200", "ja", "1200", "JPY"),
        ("CHF 1'299.\u2013", "de", "1299.00", "CHF"),
    ],
)
def test_price_formats(text: str, lang: str, amount: str, currency: str) -> None:
    money = parse_price(text, lang=lang)
    assert money is not None and (money.amount, money.currency) == (amount, currency)


def test_no_price_and_garbage() -> None:
    assert parse_price("", lang="en") is None
    assert parse_price("sold out", lang="en") is None
    assert parse_price("x" * 500) is None
    for bad in ("", "   ", b""):
        with pytest.raises(ExtractError):
            parse_html(bad)
    with pytest.raises(ExtractError):
        parse_html("<p>" * 10 + "x" * (6 * 1024 * 1024))


PAGE = """<html lang="de"><body><header><div class="promo">Versandkostenfrei ab 50,00 €</div>
</header><main><div class="grid">
<div class="card"><h3>Lamp</h3><span class="old">99,00 €</span> <b>79,00 €</b></div>
<div class="card"><h3>Chair</h3><del>1.999,00 €</del> <b>1.499,00 €</b></div>
<div class="card"><h3>Desk</h3><b>349,50 €</b></div>
</div></main></body></html>"""


def test_blocks_skip_old_prices_and_banners() -> None:
    got = extract_prices(parse_html(PAGE))
    assert got["strategy"] == "blocks" and got["currency"] == "EUR"
    assert [(p["name"], p["price"]) for p in got["products"]] == [
        ("Lamp", "79.00"),
        ("Chair", "1499.00"),
        ("Desk", "349.50"),
    ]
    with pytest.raises(ExtractError):
        extract_prices(parse_html(PAGE), strategy="nonsense")
    assert extract_prices(parse_html(PAGE), strategy="jsonld")["products"] == []
    assert extract_tables(parse_html("<table><tr><th>a</th></tr><tr><td>1</td></tr></table>")) == [
        {"caption": "", "headers": ["a"], "rows": [["1"]]}
    ]


def test_prices_in_tails_anchors_and_captcha_widgets() -> None:
    html = (
        '<html lang="en"><body><ul><li><a href="/a">Lamp</a> - $12.00</li>'
        '<li><a href="/b">Desk</a> - $1,349.50</li></ul>'
        '<a class="carousel-next" href="#">next</a>'
        '<form class="newsletter"><div class="g-recaptcha"></div></form></body></html>'
    )
    doc = parse_html(html)
    got = extract_prices(doc)["products"]
    assert [(p["name"], p["price"]) for p in got] == [("Lamp", "12.00"), ("Desk", "1349.50")]
    assert next_page_url(doc, "http://h/shop/") is None  # an in-page anchor is not a page
    assert detect_block(doc) is None  # a page with products is not a challenge
    challenge = parse_html('<html><body><div class="g-recaptcha"></div></body></html>')
    assert detect_block(challenge) == "captcha"


def test_dom_snapshot_is_stable_for_the_same_dom() -> None:
    a = '<html><body><p class="x" id="y">Hi <b>there</b></p>\n\n  <!-- c --></body></html>'
    b = "<html>\n<body>\n  <p id=y class=x>Hi <b>there</b></p></body></html>"
    c = '<html><body><p class="x" id="y">Hi <b>where</b></p></body></html>'
    sa, sb, sc = (dom_snapshot(parse_html(t)) for t in (a, b, c))
    assert sa == sb and sa[1] != sc[1]
    assert sa[0].startswith("<!DOCTYPE html>") and "<!--" not in sa[0]
    assert dom_snapshot(parse_html(sa[0])) == sa  # a snapshot is a fixed point


def test_dom_snapshot_of_an_attribute_name_lxml_cannot_write() -> None:
    """Found by ``hivemesh fuzz`` (mcp_tools): an attribute name with control
    characters parses but lxml refuses to set it back; the snapshot used to
    fail with a bare ValueError (an unexpected error of the MCP server)."""
    html = '<html><body><div itemscope itemtype{T\xa0Y\x14*R_3="x" id="k">a</div></body></html>'
    text, _ = dom_snapshot(parse_html(html))
    assert 'id="k"' in text and "\x14" not in text


# -- the MCP server, driven by the official client -------------------------------


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FixtureServer]:
    world = build_world(7, WorldOptions(slow_ms=1500))
    with serve_in_thread(world, out_dir=tmp_path_factory.mktemp("shops")) as server:
        yield server


def route_args(fx: FixtureServer) -> list[str]:
    args = ["--route", "dead=http://127.0.0.1:9"]  # a route whose proxy is down
    for name, url in fx.routes.items():
        if url:
            args += ["--route", f"{name}={url}"]
    return args


def truth(fx: FixtureServer) -> dict[str, Any]:
    shops: dict[str, Any] = json.loads(fx.ground_truth_path.read_text())["shops"]
    return shops


def rows(products: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(p["sku"], p["name"], p["price"]) for p in products]


async def check_server(client: Client, fx: FixtureServer) -> None:
    """Drive every tool against the fixture; good input and bad."""
    world = fx.world
    gt = truth(fx)
    names = {t.name for t in (await client.list_tools()).tools}
    assert names == {
        "list_routes",
        "fetch_page",
        "extract_tables",
        "extract_structured",
        "extract_prices",
        "follow_pagination",
        "dom_snapshot",
    }
    plain = [
        s
        for s in world.shops
        if not s.behaviours & {"captcha", "flaky", "slow", "human-only", "layout-change"}
    ]
    # One shop of every layout, every page, through the default route.
    for layout in ("table", "cards", "jsonld", "microdata", "list"):
        shop = next(s for s in plain if s.layout == layout and s.pages > 1)
        res = await client.call_tool("follow_pagination", {"url": fx.shop_url(shop.id)})
        assert not res.is_error, res.content
        out = res.structured_content
        assert out is not None and out["complete"] and len(out["pages"]) == shop.pages
        expected = gt[shop.id]
        assert out["currency"] == expected["currency"]
        assert rows(out["products"]) == [
            (p["sku"], p["name"], p["price"]) for p in expected["products"]
        ]
    shop = plain[0]
    res = await client.call_tool("extract_prices", {"url": fx.shop_url(shop.id)})
    out = res.structured_content
    assert out is not None and rows(out["products"]) == [
        (p["sku"], p["name"], p["price"]) for p in gt[shop.id]["products"][: shop.page_size]
    ]
    assert (out["next_page"] is not None) == (shop.pages > 1)
    # A CAPTCHA shop: refused with a code on the direct route, read through a clean one.
    cap = next(s for s in world.shops if s.captcha_routes and "flaky" not in s.behaviours)
    res = await client.call_tool("fetch_page", {"url": fx.shop_url(cap.id)})
    assert res.is_error and "captcha_required:" in res.content[0].text
    clean = next(r for r in fx.routes if r not in cap.captcha_routes)
    res = await client.call_tool("extract_prices", {"url": fx.shop_url(cap.id), "route": clean})
    assert not res.is_error and res.structured_content is not None
    assert res.structured_content["products"]
    # Snapshot of a page = snapshot of its HTML.
    page = await client.call_tool("fetch_page", {"url": fx.shop_url(shop.id)})
    assert page.structured_content is not None
    html = page.structured_content["html"]
    s1 = await client.call_tool("dom_snapshot", {"url": fx.shop_url(shop.id)})
    s2 = await client.call_tool("dom_snapshot", {"html": html})
    assert s1.structured_content is not None and s2.structured_content is not None
    assert s1.structured_content["sha256"] == s2.structured_content["sha256"]
    snap = s1.structured_content
    assert snap["blob"] == blob_digest(snap["html"].encode()).hex()  # ready for blob.put
    tables = await client.call_tool("extract_tables", {"html": html})
    structured = await client.call_tool("extract_structured", {"html": html})
    assert not tables.is_error and not structured.is_error

    # Bad input: an MCP error result with a code, never a dead server.
    slow = next(s for s in world.shops if "slow" in s.behaviours and not s.captcha_routes)
    bad: list[tuple[str, dict[str, Any], str]] = [
        ("no_such_tool", {}, "Unknown tool"),
        ("fetch_page", {"url": 42}, "validation error"),
        ("fetch_page", {"url": "http://x", "route": "nope"}, "fetch_failed: unknown route"),
        ("fetch_page", {"url": fx.shop_url(shop.id), "route": "dead"}, "fetch_failed: route dead"),
        ("fetch_page", {"url": "file:///etc/passwd"}, "invalid_argument:"),
        ("fetch_page", {"url": fx.shop_url(slow.id), "timeout_s": 0.2}, "fetch_timeout:"),
        ("extract_prices", {"html": "\x00\x01<<<>>>&&&"}, "extract_failed:"),
        ("extract_prices", {"html": "   "}, "extract_failed: empty document"),
        ("extract_prices", {"url": fx.shop_url(shop.id), "html": "<p>"}, "invalid_argument:"),
        ("extract_prices", {"html": "<p>1 €</p>", "strategy": "magic"}, "extract_failed:"),
        ("follow_pagination", {"url": fx.shop_url(shop.id), "max_pages": 0}, "invalid_argument:"),
        ("dom_snapshot", {"html": ""}, "invalid_argument:"),
    ]
    for tool, args, text in bad:
        res = await client.call_tool(tool, args)
        assert res.is_error, (tool, args)
        assert text in res.content[0].text, (tool, res.content[0].text)
    routes = await client.call_tool("list_routes", {})
    assert routes.structured_content is not None
    assert routes.structured_content["routes"] == sorted([*fx.routes, "dead"])


def test_mcp_server_over_stdio_with_the_official_client(fx: FixtureServer) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "hivemesh", "webtools", *route_args(fx)],
        env={"PYTHONPATH": SRC},
    )

    async def main() -> None:
        async with asyncio.timeout(240), Client(params) as client:
            await check_server(client, fx)

    asyncio.run(main())


def test_mcp_server_over_streamable_http(fx: FixtureServer) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hivemesh", "webtools", "--http", "127.0.0.1:0", *route_args(fx)],
        env={"PYTHONPATH": SRC, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")

        async def main() -> None:
            async with asyncio.timeout(240), Client(url) as client:  # listening once printed
                await check_server(client, fx)

        asyncio.run(main())
    finally:
        proc.terminate()
        proc.wait(15)
