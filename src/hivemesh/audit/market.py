"""The fixture's "market database": a fenced side effect (pure, no I/O).

Theory of operation
-------------------
Executors submit the prices they extracted for a shop together with the
fencing token of their lease on that shop. The database keeps, per shop, the
highest token it has accepted and refuses any submission whose token is lower
(:class:`~hivemesh.leases.errors.StaleFencingToken`): a holder that was paused past
its lease's expiry, while another executor took the lease with a larger
token, is refused here, where the effect happens. The same token is accepted
again from the writer that first presented it (a retry after a lost reply is
idempotent) and refused from anyone else. Every submission, accepted or
refused, is logged with the token its writer presented, so a test can show
exactly who was refused and why.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from hivemesh.errors import InvalidArgument
from hivemesh.leases.errors import StaleFencingToken

__all__ = ["MarketDB", "Submission"]

_SHOP = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}\Z")
_PRICE = re.compile(r"\d{1,15}(\.\d{1,6})?\Z")
_CURRENCY = re.compile(r"[A-Z]{3}\Z")
MAX_PRICES = 1000


@dataclass(frozen=True, slots=True)
class Submission:
    """One logged submission."""

    seq: int
    shop: str
    writer: str
    token: int
    accepted: bool
    #: The shop's highest accepted token when this submission arrived.
    highest_before: int
    prices: tuple[tuple[str, str, str], ...]  # (sku, price, currency)
    at_ms: int

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data."""
        return {
            "seq": self.seq,
            "shop": self.shop,
            "writer": self.writer,
            "token": self.token,
            "accepted": self.accepted,
            "highest_before": self.highest_before,
            "prices": [{"sku": s, "price": p, "currency": c} for s, p, c in self.prices],
            "at_ms": self.at_ms,
        }


def _parse_prices(prices: Any) -> tuple[tuple[str, str, str], ...]:
    if not isinstance(prices, list) or len(prices) > MAX_PRICES:
        raise InvalidArgument(f"prices must be a list of at most {MAX_PRICES} items")
    out = []
    for item in prices:
        if not isinstance(item, dict):
            raise InvalidArgument("each price must be {sku, price, currency}")
        sku, price, cur = item.get("sku"), item.get("price"), item.get("currency")
        if not (isinstance(sku, str) and 0 < len(sku) <= 200):
            raise InvalidArgument("sku must be a non-empty string")
        if not (isinstance(price, str) and _PRICE.match(price)):
            raise InvalidArgument(f"price must be decimal text like '12.50', not {price!r:.40}")
        if not (isinstance(cur, str) and _CURRENCY.match(cur)):
            raise InvalidArgument("currency must be an ISO 4217 code")
        out.append((sku, price, cur))
    return tuple(out)


class MarketDB:
    """Per-shop prices behind fencing tokens (see the module docs)."""

    def __init__(self, max_log: int = 100_000) -> None:
        self._highest: dict[str, tuple[int, str]] = {}  # shop -> (token, writer)
        self._prices: dict[str, Submission] = {}
        self._writers: dict[str, dict[str, int]] = {}
        self._log: deque[Submission] = deque(maxlen=max_log)
        self._seq = 0

    def submit(self, body: Any, now_ms: int) -> Submission:
        """Record ``body`` = ``{shop, writer, token, prices}``; the accepted submission.

        Raises :class:`InvalidArgument` for a malformed body and
        :class:`StaleFencingToken` (logged) for a token below the shop's
        highest, or equal to it from another writer.
        """
        if not isinstance(body, dict) or set(body) != {"shop", "writer", "token", "prices"}:
            raise InvalidArgument("body must be {shop, writer, token, prices}")
        shop, writer, token = body["shop"], body["writer"], body["token"]
        if not (isinstance(shop, str) and _SHOP.match(shop)):
            raise InvalidArgument("shop must be a shop id")
        if not (isinstance(writer, str) and 0 < len(writer) <= 200):
            raise InvalidArgument("writer must be a non-empty string")
        if isinstance(token, bool) or not isinstance(token, int) or not 0 < token < 2**63:
            raise InvalidArgument("token must be a positive integer")
        prices = _parse_prices(body["prices"])
        highest, holder = self._highest.get(shop, (0, ""))
        accepted = token > highest or (token == highest and writer == holder)
        self._seq += 1
        sub = Submission(self._seq, shop, writer, token, accepted, highest, prices, now_ms)
        self._log.append(sub)
        self._writers.setdefault(shop, {})[writer] = token
        if not accepted:
            raise StaleFencingToken(
                f"{shop}: token {token} from {writer} is stale (highest accepted {highest})"
            )
        self._highest[shop] = (token, writer)
        self._prices[shop] = sub
        return sub

    def highest(self, shop: str) -> int:
        """The highest token accepted for ``shop`` (0: none yet)."""
        return self._highest.get(shop, (0, ""))[0]

    def writers(self, shop: str) -> dict[str, int]:
        """The last token each writer presented for ``shop``."""
        return dict(self._writers.get(shop, {}))

    def prices(self) -> dict[str, dict[str, Any]]:
        """The accepted submission of every shop."""
        return {shop: sub.to_json() for shop, sub in sorted(self._prices.items())}

    def log(self) -> list[dict[str, Any]]:
        """Every submission, oldest first (bounded)."""
        return [sub.to_json() for sub in self._log]
