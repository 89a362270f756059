"""Restarts of a real daemon process: view checkpoints and the control
socket during rehydration (issue 12, item 7).

Each data dir is prefilled (the daemon stopped) with a five-author history
on one shared context (:mod:`hivemesh.bench._shared_history`), as if
replicated from peers; the node then starts on it as ``hivemesh up``.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from hivemesh.bench import rehydrate as bench_rehydrate
from hivemesh.bench._shared_history import CONTEXT, SharedBatch, shared_history
from hivemesh.client.blocking import Client
from hivemesh.client.swarm import LocalSwarm, wait_until
from hivemesh.commands import jsonable
from hivemesh.core.views import ContextView
from hivemesh.errors import HivemeshError
from hivemesh.stores import viewcheckpoint
from hivemesh.stores.private import secure_data_dir
from hivemesh.stores.sqlite import SQLiteStore


def _prefill(data_dir: Path, batches: list[SharedBatch]) -> None:
    secure_data_dir(data_dir)
    with SQLiteStore(data_dir / "store.db") as store:
        for author, events, sig in batches:
            store.append(author, events, sig)


def _expected(batches: list[SharedBatch]) -> Any:
    view = ContextView(None)
    for _a, events, _s in batches:
        for ev in events:
            view.apply(ev)
    return jsonable(view.snapshot()[CONTEXT])


def _ctx_events(batches: list[SharedBatch]) -> int:
    return sum(1 for _a, evs, _s in batches for e in evs if e.kind == "ctx.update")


def _rehydration(c: Client) -> dict[str, Any]:
    st = c.wait_running(30)
    out: dict[str, Any] = st["journal"]["rehydration"]
    out["counters"] = {k: v for k, v in st["counters"].items() if "checkpoint" in k}
    return out


def _stop(swarm: LocalSwarm, label: str) -> None:
    swarm.kill(label, signal.SIGTERM)  # a clean stop: the daemon writes its checkpoint


def test_restart_replays_only_the_tail(tmp_path: Path) -> None:
    batches = list(shared_history(6000, 5, 21, others=0.2))
    cut = len(batches) * 3 // 4
    head, tail = batches[:cut], batches[cut:]
    swarm = LocalSwarm(tmp_path)
    data_dir = tmp_path / "a"
    _prefill(data_dir, head)
    try:
        node = swarm.start("a")
        first = _rehydration(node.client)
        assert first["checkpoint"] == "none"
        assert first["ctx_imports"] == _ctx_events(head) and first["ctx_imports_pending"] == 0
        assert first["counters"]["view_checkpoint_saved"] == 1  # the tail was long: at start
        # the replay verified the 5 chains and one head signature each; the
        # others are audited off the event loop once the node is up
        assert first["signatures_verified"] == 5 and first["signatures_covered"] > 0
        wait_until(
            lambda: node.client.call("status")["journal"]["rehydration"]["signature_audit"] == "ok",
            30,
            what="signature audit",
        )
        _stop(swarm, "a")
        assert viewcheckpoint.checkpoint_path(data_dir / "store.db").exists()
        _prefill(data_dir, tail)  # more history arrived (as if by a restore of peers' feeds)
        swarm.restart("a")
        second = _rehydration(node.client)
        assert second["checkpoint"] == "loaded"
        assert second["counters"]["view_checkpoint_loaded"] == 1
        assert second["ctx_imports"] == _ctx_events(tail)  # only the tail went through loro
        assert second["ctx_skipped"] == _ctx_events(head)
        assert node.client.ctx_get(CONTEXT) == _expected(batches)

        # a damaged checkpoint: refused, counted, everything replayed, same state
        _stop(swarm, "a")
        path = viewcheckpoint.checkpoint_path(data_dir / "store.db")
        raw = path.read_bytes()
        path.write_bytes(raw[:-7] + bytes([raw[-7] ^ 0x40]) + raw[-6:])
        swarm.restart("a")
        third = _rehydration(node.client)
        assert third["checkpoint"].startswith("ignored: checksum")
        assert third["counters"]["view_checkpoint_ignored_checksum"] == 1
        assert third["ctx_imports"] == _ctx_events(batches) and third["ctx_skipped"] == 0
        assert node.client.ctx_get(CONTEXT) == _expected(batches)
        log = (data_dir / "daemon.log").read_text()
        assert "view checkpoint" in log and "not used" in log
    finally:
        swarm.close()


def test_control_socket_answers_while_rehydrating(tmp_path: Path) -> None:
    """``status`` answers during the replay and says how far it is; a
    ``ctx.get`` sent meanwhile waits and then sees the complete context."""
    batches = list(shared_history(30_000, 5, 22, others=0.5))
    data_dir = tmp_path / "a"
    _prefill(data_dir, batches)
    total = sum(len(evs) for _a, evs, _s in batches)
    swarm = LocalSwarm(tmp_path)  # for its environment only
    cmd = [sys.executable, "-m", "hivemesh", "up", "--json", "--data-dir", str(data_dir)]
    cmd += ["--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(cmd, env=swarm.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    client = Client(data_dir, timeout_s=30.0)
    seen: list[dict[str, int]] = []
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(client.ctx_get(CONTEXT)))
    try:

        def answered() -> bool:
            try:
                st = client.call("status", timeout_s=2.0)
            except HivemeshError:
                return False  # not listening yet
            if "rehydrating" not in st:
                return True
            seen.append(st["rehydrating"])
            if not reader.is_alive() and not got:
                reader.start()  # sent while the views are incomplete: it must wait
            return False

        wait_until(answered, 60, what="the daemon to start", interval_s=0.002)
        assert seen, "the daemon answered only once it had finished replaying"
        assert all(s["total"] == total and 0 <= s["done"] <= total for s in seen)
        assert any(s["done"] < total for s in seen)
        reader.join(60)
        assert got == [_expected(batches)]  # the complete context, never a partial one
        st = client.wait_running(30)
        assert st["journal"]["rehydrated"] == total
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        swarm.close()


def test_bench_shared_document_runs_small() -> None:
    """``bench rehydrate``'s shared-document workload, small: real daemon
    restarts, the second one from the checkpoint the first one wrote."""
    args = argparse.Namespace(events=500, authors=2, repeat=1, seed=3, shared_updates=3000)
    result = bench_rehydrate.run(args)
    shared = [m for m in result.metrics if m.name.startswith("shared doc")]
    assert len(shared) == 5 and all(m.ours > 0 and m.baseline for m in shared)
    d = result.details
    assert d["shared_updates"] == 3000
    assert d["shared_restart_cold"]["checkpoint"] == "none"
    assert d["shared_restart_cold"]["ctx_imports"] == 3000
    assert d["shared_restart_checkpoint"]["checkpoint"] == "loaded"
    assert d["shared_restart_checkpoint"]["ctx_imports"] == 0
    assert d["shared_restart_checkpoint"]["ctx_skipped"] == 3000
