"""``hivemesh bench audit``'s baseline: the plain asyncio scraper reads the
whole fixture right, and duplicate fetches are counted from the fixture."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from hivemesh.audit.server import serve_in_thread
from hivemesh.audit.world import WorldOptions, build_world
from hivemesh.bench.audit import _duplicates, plain_audit


def test_the_plain_scraper_reads_every_price_once(tmp_path: Path) -> None:
    world = build_world(7, WorldOptions(slow_ms=100))
    with serve_in_thread(world, out_dir=tmp_path) as fx:
        human = next(s for s in world.shops if "human-only" in s.behaviours)
        ready = {
            "url": fx.url,
            "routes": fx.routes,
            "market": fx.market_url,
            "operator": {"shop": human.id, "code": world.operator_code()},
        }
        got = asyncio.run(plain_audit(ready, concurrency=12))
        stats = fx.stats()
        truth = world.ground_truth(fx.url)
        for sid, t in truth["shops"].items():
            have = [(p["sku"], p["price"]) for p in got["products"][sid]]
            assert have == [(p["sku"], p["price"]) for p in t["products"]], sid
        assert _duplicates(stats, truth) == 0
        assert len(fx.market.prices()) == len(world.shops)
        # the counter sees a page served whole twice
        one = next(s for s in world.shops if not s.behaviours)
        httpx.get(fx.shop_url(one.id), timeout=10)
        assert _duplicates(fx.stats(), truth) == 1
