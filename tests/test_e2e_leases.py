"""Leases and claims on a real swarm: 5 ``hivemesh up`` processes on loopback.

Every daemon hosts a quorum voter; clients reach the quorum through a
daemon's control socket (``mesh://DATA_DIR``). Histories recorded by
concurrent clients on several nodes go through the checker of
:mod:`hivemesh.verify.linearizability`, including ``kill -9`` of a voter minority and of
a lease holder. Claims: ``kill -9`` of the winner, another node takes the
work after ``member.down``. One swarm per module; the tests run in order.
Every wait is a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from hivemesh.client.swarm import LocalSwarm, wait_until
from hivemesh.errors import BackendUnavailable, InvalidArgument
from hivemesh.leases import LeaseClient, open_backend
from hivemesh.leases.errors import LeaseUnavailable
from hivemesh.verify import check_history
from lease_workload import run_workload

T = TypeVar("T")
LABELS = ["n0", "n1", "n2", "n3", "n4"]


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    root: Path = tmp_path_factory.mktemp("leaseswarm")
    with LocalSwarm(root) as s:
        yield s


def run(coro: Awaitable[T], limit_s: float = 30) -> T:
    async def main() -> T:
        async with asyncio.timeout(limit_s):
            return await coro

    return asyncio.run(main())


def url(swarm: LocalSwarm, label: str) -> str:
    return f"mesh://{swarm.nodes[label].data_dir.resolve()}"


def up_members(swarm: LocalSwarm, label: str) -> set[str]:
    members = swarm.status(label)["members"]
    return {a for a, m in members.items() if m["state"] == "up"}


def wait_all_up(swarm: LocalSwarm) -> None:
    addrs = {swarm.nodes[label].address for label in LABELS}
    for label in LABELS:
        others = addrs - {swarm.nodes[label].address}
        wait_until(
            lambda label=label, others=others: up_members(swarm, label) >= others,
            15,
            what=f"{label} sees the others up",
        )
    # Membership converging is not the same as every channel carrying votes
    # again (a restarted voter redials; a simultaneous dial may be replaced):
    # wait until every node completes a quorum round.
    for label in LABELS:
        wait_until(
            lambda label=label: _quorum_answers(swarm, label),
            15,
            what=f"{label} reaches a quorum of voters",
        )


def _quorum_answers(swarm: LocalSwarm, label: str) -> bool:
    """A majority *grants* again: restarted voters refuse grants for the
    longest TTL they ever granted (quarantine), so a read is not enough."""
    node = swarm.nodes[label]
    try:
        got = node.client.call(
            "lease.acquire", resource=f"probe-{label}", holder=node.address, ttl_ms=500
        )
        if got["token"] is None:
            return False
        node.client.call(
            "lease.release", resource=f"probe-{label}", holder=node.address, token=got["token"]
        )
    except BackendUnavailable:
        return False
    return True


def test_every_node_votes_and_agrees_on_the_voter_set(swarm: LocalSwarm) -> None:
    first = swarm.start("n0")
    for label in LABELS[1:]:
        swarm.start(label, bootstrap=[first.endpoint])
    wait_all_up(swarm)
    sets = [swarm.nodes[label].client.call("lease.voters") for label in LABELS]
    addresses = sorted(swarm.nodes[label].address for label in LABELS)
    assert all(s["voters"] == addresses and s["majority"] == 3 for s in sets)
    # one acquire through n2: a majority of the *other* daemons voted over the mesh
    tok = swarm.nodes["n2"].client.call("lease.acquire", resource="warmup", holder="w", ttl_ms=200)
    assert tok["token"] == 1
    voted = sum(
        swarm.nodes[label].client.call("lease.voters")["mesh"].get("voted", 0)
        for label in LABELS
        if label != "n2"
    )
    assert voted >= 4  # prepare + accept from at least two remote voters
    # a late joiner adopts the published set (once its journal caught up)
    late = swarm.start("late", bootstrap=[first.endpoint])
    wait_until(lambda: swarm.converged(), 15, what="the late joiner's journal converges")
    assert late.client.call("lease.voters")["voters"] == addresses
    swarm.kill("late")
    del swarm.nodes["late"]


def test_concurrent_clients_on_three_nodes_with_a_voter_minority_killed(
    swarm: LocalSwarm,
) -> None:
    urls = itertools.cycle([url(swarm, label) for label in ("n0", "n1", "n2")])

    async def main() -> Any:
        async def killer() -> None:
            await asyncio.sleep(0.8)
            await asyncio.to_thread(swarm.kill, "n3")
            await asyncio.to_thread(swarm.kill, "n4")

        kt = asyncio.create_task(killer())
        res = await run_workload(
            lambda: open_backend(next(urls)), seed=7, clients=6, resources=2, duration_s=3.0
        )
        await kt
        return res

    res = run(main())
    violations = check_history(res.ops, slack_ms=150, replicated=True)
    assert violations == [], violations[:5]
    s = Counter(f"{o.kind}:{o.outcome}" for o in res.ops)
    late = [o for o in res.ops if o.kind == "acquire" and o.outcome == "ok" and o.invoke_ms > 1500]
    # floors, not speed: they only prove the run exercised contention (machines get busy)
    assert s["acquire:ok"] >= 10 and s["acquire:fail"] >= 2 and s["release:ok"] >= 5, s
    assert late, f"no grant after the minority died: {s}"  # 3 of 5 voters still decide
    assert res.stale_tokens == 0 and res.effects > 0
    for label in ("n3", "n4"):
        swarm.restart(label)
    wait_all_up(swarm)


def test_kill_9_of_a_holder_its_lease_expires_by_ttl_with_a_larger_token(
    swarm: LocalSwarm,
) -> None:
    try:
        _kill_holder_and_wait_out_its_ttl(swarm)
    finally:  # leave the shared swarm whole for the tests after this one
        if not swarm.nodes["n1"].running:
            swarm.restart("n1")
        wait_all_up(swarm)


def _kill_holder_and_wait_out_its_ttl(swarm: LocalSwarm) -> None:
    n1, n2 = swarm.nodes["n1"], swarm.nodes["n2"]
    ttl_ms = 3000  # long enough that a busy machine still sees it held after the kill
    t_invoke = time.monotonic()
    got = n1.client.call("lease.acquire", resource="browser-1", holder=n1.address, ttl_ms=ttl_ms)
    token = got["token"]
    assert isinstance(token, int)
    swarm.kill("n1")  # kill -9 mid-lease: nobody releases it
    # n1's grant may have reached a bare majority, n1's own voter among them:
    # the live voters then split 2 held / 2 free. That is "busy", promptly
    # (it used to wait for the dead voter: BackendUnavailable for the whole TTL).
    busy = n2.client.call("lease.acquire", resource="browser-1", holder=n2.address, ttl_ms=ttl_ms)
    assert busy["token"] is None
    shown = n2.client.call("lease.show", resource="browser-1")
    assert shown["held"] and shown["holder"] == n1.address and shown["fencing_token"] == token
    taken = wait_until(
        lambda: n2.client.call(
            "lease.acquire", resource="browser-1", holder=n2.address, ttl_ms=ttl_ms
        )["token"],
        10,
        what="the lease of the dead holder expires",
        interval_s=0.02,
    )
    waited_ms = (time.monotonic() - t_invoke) * 1000
    assert taken > token
    assert waited_ms >= ttl_ms * 0.99 - 5  # never before the holder's own belief ran out
    n2.client.call("lease.release", resource="browser-1", holder=n2.address, token=taken)


def test_claims_winner_killed_another_node_takes_the_work(swarm: LocalSwarm) -> None:
    n3, n2, n0 = swarm.nodes["n3"], swarm.nodes["n2"], swarm.nodes["n0"]
    first = n3.client.call("claim", resource="job-1")
    assert first["winner"] == n3.address
    wait_until(
        lambda: n2.client.call("claim.show", resource="job-1")["winner"] == n3.address,
        10,
        what="n2 sees n3's claim",
    )
    n2.client.call("claim", resource="job-1")  # later: loses while n3 lives
    for node in (n3, n2, n0):
        got = node.client.call("claim.wait", resource="job-1", timeout_s=5)
        assert got["winner"] == n3.address
    swarm.kill("n3")
    wait_until(lambda: swarm.member_state("n2", "n3") == "down", 15, what="n2 marks n3 down")
    got = n2.client.call("claim.wait", resource="job-1", timeout_s=10)
    assert got["winner"] == n2.address and got["ours"]
    wait_until(
        lambda: n0.client.call("claim.show", resource="job-1")["winner"] == n2.address,
        10,
        what="n0 agrees n2 took over",
    )
    n2.client.call("claim.done", resource="job-1")
    wait_until(
        lambda: len(n0.client.call("claim.show", resource="job-1")["done_by"]) == 1,
        10,
        what="n0 sees job-1 done",
    )
    assert n0.client.call("claim.show")["duplicates"] == {}
    swarm.restart("n3")
    wait_all_up(swarm)


def test_node_leases_python_api_and_typed_errors(swarm: LocalSwarm, tmp_path: Path) -> None:
    async def main() -> None:
        client = LeaseClient(open_backend(url(swarm, "n4")), "api-client", call_timeout_s=2.0)
        try:
            lease = await client.try_acquire("api-res", ttl_ms=1000)
            with pytest.raises(InvalidArgument):
                await client.try_acquire("api-res", ttl_ms=1)
            with pytest.raises(InvalidArgument):
                await client.try_acquire("bad resource name!", ttl_ms=1000)
            other = LeaseClient(open_backend(url(swarm, "n0")), "other", call_timeout_s=2.0)
            with pytest.raises(LeaseUnavailable):
                await other.try_acquire("api-res", ttl_ms=1000)
            await other.aclose()
            await client.release(lease)
        finally:
            await client.aclose()
        # no daemon on that data dir: a typed error, fast
        dead = LeaseClient(open_backend(f"mesh://{tmp_path}"), "x", call_timeout_s=1.0)
        t0 = time.monotonic()
        with pytest.raises(BackendUnavailable):
            await dead.try_acquire("r", ttl_ms=1000)
        assert time.monotonic() - t0 < 1.5
        await dead.aclose()

    run(main())


def cli(swarm: LocalSwarm, *argv: str) -> tuple[int, dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "hivemesh", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env=swarm.env,
    )
    return out.returncode, json.loads(out.stdout or out.stderr)


def test_cli_lease_defaults_to_the_local_swarm_and_claim_takes_work(swarm: LocalSwarm) -> None:
    d1, d2 = (str(swarm.nodes[label].data_dir) for label in ("n1", "n2"))
    # a TTL that outlives the three CLI starts below on a busy machine (~2 s each)
    acquire = ["acquire", "cli-res", "--holder", "ci-1", "--ttl-ms", "20000"]
    rc, got = cli(swarm, "lease", "--data-dir", d1, *acquire)
    assert rc == 0 and got["holder"] == "ci-1" and got["fencing_token"] >= 1
    rc, busy = cli(
        swarm, "lease", "--data-dir", d2, "acquire", "cli-res", "--holder", "ci-2", "--json"
    )
    assert rc == 5 and busy["error"]["code"] == "lease_unavailable"
    rc, shown = cli(swarm, "lease", "show", "cli-res", "--data-dir", d2)  # options after the action
    assert rc == 0 and shown["holder"] == "ci-1"
    token = str(got["fencing_token"])
    rc, _ = cli(
        swarm, "lease", "--data-dir", d2, "release", "cli-res", "--holder", "ci-1", "--token", token
    )
    assert rc == 0
    rc, won = cli(swarm, "claim", "take", "cli-job", "--wait-s", "5", "--data-dir", d1, "--json")
    assert rc == 0 and won["ours"] and won["winner"] == swarm.nodes["n1"].address
    rc, lost = cli(swarm, "claim", "take", "cli-job", "--wait-s", "5", "--data-dir", d2, "--json")
    assert rc == 5 and not lost["ours"] and lost["winner"] == swarm.nodes["n1"].address


def test_no_majority_is_a_typed_error_within_the_deadline(swarm: LocalSwarm) -> None:
    for label in ("n2", "n3", "n4"):
        swarm.kill(label)

    async def main() -> float:
        client = LeaseClient(open_backend(url(swarm, "n0")), "lonely", call_timeout_s=0.5)
        t0 = time.monotonic()
        try:
            with pytest.raises(BackendUnavailable):
                await client.try_acquire("minority", ttl_ms=1000)
        finally:
            await client.aclose()
        return time.monotonic() - t0

    elapsed = run(main())
    assert elapsed < 0.8


def test_tokens_keep_increasing_after_every_voter_is_killed_and_restarted(
    tmp_path: Path,
) -> None:
    """kill -9 of *all* voters (3 daemons of their own): no majority survives in
    memory, so only what each voter synced before acknowledging keeps tokens
    monotonic. Within a resource's token reserve the voters sync nothing, so
    the restored bound is above every token granted, not equal to it."""
    from hivemesh.runtime.leases import TOKEN_RESERVE

    labels = ["k0", "k1", "k2"]
    with LocalSwarm(tmp_path) as s:
        first = s.start("k0")
        for label in labels[1:]:
            s.start(label, bootstrap=[first.endpoint])
        addrs = {s.nodes[label].address for label in labels}
        for label in labels:
            wait_until(
                lambda label=label: up_members(s, label) >= addrs - {s.nodes[label].address},
                15,
                what=f"{label} sees the others up",
            )
        k1 = s.nodes["k1"]
        assert len(k1.client.call("lease.voters")["voters"]) == 3
        tokens = []
        for _ in range(5):
            got = k1.client.call("lease.acquire", resource="r", holder="h", ttl_ms=300)
            tokens.append(got["token"])
            k1.client.call("lease.release", resource="r", holder="h", token=got["token"])
        assert tokens == [1, 2, 3, 4, 5]
        syncs = sum(
            s.nodes[x].client.call("lease.voters")["mesh"].get("voter_fsync", 0) for x in labels
        )
        assert syncs <= 3  # one per voter reached, for the first grant only
        for label in labels:
            s.kill(label)
        for label in labels:
            s.restart(label)

        def granted() -> int | None:
            try:
                got = s.nodes["k2"].client.call(
                    "lease.acquire", resource="r", holder="h2", ttl_ms=300
                )
            except BackendUnavailable:
                return None  # channels still coming back
            token: int | None = got["token"]  # None while the restored voters quarantine
            return token

        taken = wait_until(granted, 20, what="a grant after the restart", interval_s=0.05)
        assert 5 < taken <= 1 + TOKEN_RESERVE + 1
