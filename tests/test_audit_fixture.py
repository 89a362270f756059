"""The 50-shop fixture world over real HTTP: determinism, ground truth,
CAPTCHA per route, slow, flaky, layout change, human-only, the fenced market
database, and garbage on the wire."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import hivemesh
from hivemesh.audit.pages import shop_page
from hivemesh.audit.server import FixtureServer, serve_in_thread
from hivemesh.audit.world import LAYOUTS, Shop, World, WorldOptions, build_world
from hivemesh.webtools.errors import AccessCodeRequired, CaptchaRequired, FetchError, FetchTimeout
from hivemesh.webtools.extract import extract_prices, next_page_url, parse_html
from hivemesh.webtools.fetch import Fetcher

SRC = str(Path(hivemesh.__file__).resolve().parent.parent)
FAST = WorldOptions(slow_ms=60)


def with_behaviour(world: World, name: str) -> list[Shop]:
    return [s for s in world.shops if name in s.behaviours]


def clean_route(shop: Shop) -> str:
    return next(
        r for r in ("direct", "proxy-1", "proxy-2", "proxy-3") if r not in shop.captcha_routes
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FixtureServer]:
    with serve_in_thread(build_world(7, FAST), out_dir=tmp_path_factory.mktemp("fx")) as fx:
        yield fx


def test_world_is_deterministic_from_the_seed() -> None:
    a, b, c = build_world(7), build_world(7), build_world(8)
    assert a == b and a != c
    assert a.ground_truth("http://x") == b.ground_truth("http://x") != c.ground_truth("http://x")
    assert a.operator_code() == b.operator_code() != c.operator_code()
    for sa, sb in zip(a.shops, b.shops, strict=True):
        for page in range(1, sa.pages + 1):
            for changed in (False, True):
                assert shop_page(a, sa, page, changed=changed, code=None) == shop_page(
                    b, sb, page, changed=changed, code=None
                )
    # The variety the audit needs, in every world.
    for w in (a, c):
        assert len(w.shops) == 50
        counts = {n: len(with_behaviour(w, n)) for n in ("captcha", "slow", "flaky")}
        assert counts == {"captcha": 5, "slow": 6, "flaky": 8}
        assert len(with_behaviour(w, "layout-change")) == len(with_behaviour(w, "human-only")) == 1
        assert {s.layout for s in w.shops} == set(LAYOUTS)
        assert len({s.currency for s in w.shops}) == 8 and len({s.locale for s in w.shops}) == 10
        assert {s.pagination for s in w.shops} == {"rel-next", "numbered", "head-link"}
        assert sum(s.pages > 1 for s in w.shops) > 25
        assert all(
            s.captcha_routes and "direct" in s.captcha_routes for s in with_behaviour(w, "captcha")
        )
        assert all(len(s.captcha_routes) < 4 for s in w.shops)
        assert any(p.was() for s in w.shops for p in s.products)  # crossed-out old prices


async def crawl(fetcher: Fetcher, base: str, shop: Shop, code: str) -> tuple[list[Any], list[str]]:
    """A correct scraper: a clean route, retries on transport failures, the
    operator's code where needed, every page by its next link."""
    url: str | None = f"{base}/{shop.id}/" + (
        f"?code={code}" if "human-only" in shop.behaviours else ""
    )
    products: list[Any] = []
    htmls: list[str] = []
    while url is not None:
        for attempt in range(4):
            try:
                page = await fetcher.fetch(url, route=clean_route(shop), timeout_s=10)
                break
            except FetchError:
                if attempt == 3:
                    raise
        doc = parse_html(page.html)
        htmls.append(page.html)
        found = extract_prices(doc)
        products += [(p["sku"], p["name"], p["price"], p["currency"]) for p in found["products"]]
        url = next_page_url(doc, page.final_url)
    return products, htmls


def test_ground_truth_equals_what_a_correct_extractor_reads(served: FixtureServer) -> None:
    truth = json.loads(served.ground_truth_path.read_text())
    assert truth["seed"] == 7 and len(truth["shops"]) == 50
    world = served.world

    async def main() -> dict[str, tuple[list[Any], list[str]]]:
        fetcher = Fetcher(served.routes)
        sem = asyncio.Semaphore(8)

        async def one(shop: Shop) -> tuple[str, tuple[list[Any], list[str]]]:
            async with sem:
                return shop.id, await crawl(fetcher, served.url, shop, world.operator_code())

        try:
            return dict(await asyncio.gather(*(one(s) for s in world.shops)))
        finally:
            await fetcher.aclose()

    read = asyncio.run(main())
    for shop_id, entry in truth["shops"].items():
        expected = [(p["sku"], p["name"], p["price"], entry["currency"]) for p in entry["products"]]
        assert read[shop_id][0] == expected, shop_id
    # The layout-change shop really changed part-way through its pages.
    (changing,) = with_behaviour(world, "layout-change")
    htmls = read[changing.id][1]
    assert "<table" in htmls[0] and "<table" not in htmls[-1] and 'class="tile"' in htmls[-1]
    # Every page of every shop was read, and flaky shops did fail on the way.
    stats = served.stats()["by_shop"]
    flaky_failures = sum(
        n
        for s in with_behaviour(world, "flaky")
        for outcomes in stats[s.id].values()
        for k, n in outcomes.items()
        if k != "ok"
    )
    assert flaky_failures > 0


def test_captcha_depends_on_the_route(served: FixtureServer) -> None:
    shops = with_behaviour(served.world, "captcha")

    async def main() -> None:
        fetcher = Fetcher(served.routes)
        try:
            for shop in shops:
                for route in served.routes:
                    url = served.shop_url(shop.id)
                    if route in shop.captcha_routes:
                        for _ in range(2):  # every time, not by chance
                            with pytest.raises(CaptchaRequired):
                                await fetcher.fetch(url, route=route)
                    elif "flaky" not in shop.behaviours:
                        assert (await fetcher.fetch(url, route=route)).status == 200
        finally:
            await fetcher.aclose()

    asyncio.run(main())


def test_slow_shops_miss_a_short_deadline_and_meet_a_long_one(tmp_path: Path) -> None:
    world = build_world(7, WorldOptions(slow_ms=600))
    shop = next(s for s in with_behaviour(world, "slow") if not s.captcha_routes)
    assert 360 <= shop.delay_ms <= 840

    async def main(fx: FixtureServer) -> None:
        fetcher = Fetcher(fx.routes)
        try:
            with pytest.raises(FetchTimeout):
                await fetcher.fetch(fx.shop_url(shop.id), timeout_s=0.2)
            page = await fetcher.fetch(fx.shop_url(shop.id), timeout_s=10)
            assert page.elapsed_ms >= shop.delay_ms
        finally:
            await fetcher.aclose()

    with serve_in_thread(world, out_dir=tmp_path) as fx:
        asyncio.run(main(fx))


def outcomes(fx: FixtureServer, shop: Shop, n: int) -> list[str]:
    """What ``n`` requests in a row to a flaky shop's first page see."""

    async def main() -> list[str]:
        fetcher = Fetcher(fx.routes)
        seen = []
        try:
            for _ in range(n):
                try:
                    await fetcher.fetch(fx.shop_url(shop.id), route=clean_route(shop), timeout_s=5)
                    seen.append("ok")
                except FetchError as exc:
                    seen.append(str(exc.status) if exc.status else "broken")
        finally:
            await fetcher.aclose()
        return seen

    return asyncio.run(main())


def test_flaky_failures_are_reproducible_from_the_seed(tmp_path: Path) -> None:
    world = build_world(7, FAST)
    shop = with_behaviour(world, "flaky")[0]
    runs = []
    for i in range(2):
        with serve_in_thread(world, out_dir=tmp_path / str(i)) as fx:
            runs.append(outcomes(fx, shop, 12))
    predicted = [world.outcome(shop, 1, n) for n in range(12)]
    expected = [{"reset": "broken", "truncate": "broken"}.get(o, o) for o in predicted]
    assert runs[0] == runs[1] == expected
    assert "ok" in expected and any(o != "ok" for o in expected)
    # Never more failures in a row than the cap, so retries always get through.
    worst = max(len(r) for r in "".join("x" if o != "ok" else "." for o in expected).split("."))
    assert worst <= world.options.max_consecutive_failures
    other = build_world(8, FAST)
    assert [other.outcome(s, 1, n) for s in with_behaviour(other, "flaky") for n in range(12)] != [
        world.outcome(s, 1, n) for s in with_behaviour(world, "flaky") for n in range(12)
    ]


def test_the_human_only_shop_opens_with_the_operator_code_only(served: FixtureServer) -> None:
    (shop,) = with_behaviour(served.world, "human-only")
    code = served.world.operator_code()

    async def main() -> None:
        fetcher = Fetcher(served.routes)
        try:
            for suffix, status in (("", 401), ("?code=0000-0000", 403)):
                with pytest.raises(AccessCodeRequired) as err:
                    await fetcher.fetch(served.shop_url(shop.id) + suffix, route="proxy-3")
                assert err.value.status == status
            page = await fetcher.fetch(served.shop_url(shop.id) + f"?code={code}", route="proxy-3")
            doc = parse_html(page.html)
            assert extract_prices(doc)["products"]
            nxt = next_page_url(doc, page.final_url)
            assert shop.pages == 1 or (nxt is not None and f"code={code}" in nxt)
        finally:
            await fetcher.aclose()

    asyncio.run(main())
    # The code is given to the operator, never published.
    assert code not in served.ground_truth_path.read_text()
    assert code not in httpx.get(served.url + "/shops.json").text


def test_market_database_refuses_a_paused_holders_stale_token(served: FixtureServer) -> None:
    url = served.market_url
    prices = [{"sku": "01-001-0000", "price": "12.50", "currency": "CHF"}]

    def submit(writer: str, token: int, body: Any = None) -> httpx.Response:
        data = (
            body
            if body is not None
            else {"shop": "shop-01", "writer": writer, "token": token, "prices": prices}
        )
        return httpx.post(url, json=data, timeout=5)

    assert submit("exec-a", 5).status_code == 200  # a holds the lease (token 5)
    # a pauses; its lease expires; b takes the lease with token 6 and submits.
    assert submit("exec-b", 6).status_code == 200
    late = submit("exec-a", 5)  # a wakes up and submits with its old token
    assert late.status_code == 409
    assert late.json()["error"] == {
        "code": "stale_fencing_token",
        "message": "shop-01: token 5 from exec-a is stale (highest accepted 6)",
        "highest": 6,
    }
    assert submit("exec-b", 6).status_code == 200  # b's retry is idempotent
    assert submit("exec-c", 6).status_code == 409  # the same token from someone else
    for bad in (
        {"shop": "shop-01"},
        {"shop": "shop-01", "writer": "x", "token": True, "prices": []},
        [1],
    ):
        r = submit("x", 1, bad)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument"
    r = httpx.post(url, content=b"{not json", timeout=5)
    assert r.status_code == 400
    log = httpx.get(served.url + "/market/log", timeout=5).json()
    shop01 = [
        (e["writer"], e["token"], e["accepted"], e["highest_before"])
        for e in log
        if e["shop"] == "shop-01"
    ]
    assert shop01 == [
        ("exec-a", 5, True, 0),
        ("exec-b", 6, True, 5),
        ("exec-a", 5, False, 6),
        ("exec-b", 6, True, 6),
        ("exec-c", 6, False, 6),
    ]
    assert served.market.writers("shop-01") == {"exec-a": 5, "exec-b": 6, "exec-c": 6}
    accepted = httpx.get(url, timeout=5).json()["shop-01"]
    assert accepted["writer"] == "exec-b" and accepted["token"] == 6


def raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_proxies_reach_only_the_fixture_and_garbage_gets_400(served: FixtureServer) -> None:
    proxy = served.routes["proxy-1"]
    assert proxy is not None
    with httpx.Client(proxy=proxy, trust_env=False, timeout=5) as client:
        assert client.get("http://example.com/").status_code == 502
        assert client.get(served.shop_url("shop-02")).status_code in (200, 500, 503)
    origin = int(served.url.rsplit(":", 1)[1])
    assert raw(origin, b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert raw(origin, b"GET / HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n").startswith(
        b"HTTP/1.1 400"
    )
    assert raw(origin, b"CONNECT example.com:443 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
    assert raw(origin, b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n").startswith(
        b"HTTP/1.1 404"
    )
    with httpx.Client(timeout=5) as client:  # HEAD, then GET on the same connection
        head = client.head(served.url + "/shops.json")
        assert head.status_code == 200 and head.content == b""
        assert client.get(served.url + "/shops.json").json()[0]["id"] == "shop-01"


def test_cli_serves_and_prints_where_things_are(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hivemesh",
            "fixture",
            "shops",
            "--json",
            "--seed",
            "3",
            "--out",
            str(tmp_path),
        ],
        env={"PYTHONPATH": SRC, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert Path(ready["ground_truth"]) == tmp_path / "ground-truth.json"
        truth = json.loads(Path(ready["ground_truth"]).read_text())
        assert truth["seed"] == 3 and truth["base_url"] == ready["url"]
        assert ready["operator"]["code"] == build_world(3).operator_code()
        assert set(ready["routes"]) == {"direct", "proxy-1", "proxy-2", "proxy-3"}
        shops = httpx.get(ready["url"] + "/shops.json", timeout=5).json()
        assert [s["id"] for s in shops] == sorted(truth["shops"])
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_connections_are_capped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import hivemesh.audit.server as server_mod

    monkeypatch.setattr(server_mod, "MAX_CONNECTIONS", 2)
    with serve_in_thread(build_world(7, FAST), out_dir=tmp_path) as fx:
        port = int(fx.url.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
        try:
            for s in idle:  # both served (a request each keeps them open)
                s.sendall(b"GET /shops.json HTTP/1.1\r\n\r\n")
                assert s.recv(12) == b"HTTP/1.1 200"
            assert raw(port, b"GET / HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 503")
            assert fx.refused == 1
        finally:
            for s in idle:
                s.close()
