"""Helpers for the dashboard's tests: a ``hivemesh dashboard`` process and a
real headless Chromium (the system's Debian package, driven by Playwright,
which must never download a browser of its own)."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import hivemesh

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")

__all__ = ["Browser", "chromium_path", "dashboard_process", "open_browser", "save_artifact"]

SRC = str(Path(hivemesh.__file__).resolve().parent.parent)


def chromium_path() -> str:
    """The system Chromium (scripts/services.d/chromium.sh installs it)."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no system Chromium: run scripts/services.sh (apt-get install chromium)")


def save_artifact(src: Path, name: str) -> list[Path]:
    """Copy ``src`` beside the test's files and into ``$HIVEMESH_ARTIFACTS``."""
    out = [src]
    where = os.environ.get("HIVEMESH_ARTIFACTS")
    if where:
        dest = Path(where) / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        out.append(dest)
    return out


@contextmanager
def dashboard_process(
    data_dir: Path, env: Mapping[str, str], *args: str, timeout_s: float = 30.0
) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    """``hivemesh dashboard --data-dir DATA_DIR --port 0 --json ARGS``: the
    process and its ready line; killed on the way out."""
    full = {**env, "PYTHONPATH": SRC}
    argv = ["dashboard", "--data-dir", str(data_dir), "--port", "0", "--json", *args]
    proc = subprocess.Popen(
        [sys.executable, "-m", "hivemesh", *argv],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        buf = b""
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.poll() is not None and proc.stderr else ""
                pytest.fail(f"hivemesh dashboard did not start in {timeout_s} s: {err[-2000:]}")
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if ready:
                buf += os.read(proc.stdout.fileno(), 4096)
        yield proc, json.loads(buf.split(b"\n", 1)[0])
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()


class Browser:
    """One page in headless Chromium, with every console error and page
    error it reports."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))

    def _console(self, msg: Any) -> None:
        if msg.type == "error":
            self.errors.append(f"console: {msg.text}")

    def wait_for(self, js: str, timeout_s: float, arg: Any = None) -> Any:
        """Wait until the page's ``js`` (a function body's expression) is
        truthy; its value."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        # a function, not an expression: the page's CSP forbids evaluating strings
        func = f"() => ({js})"
        try:
            handle = self.page.wait_for_function(func, arg=arg, timeout=timeout_s * 1000)
        except PlaywrightTimeout:
            pytest.fail(f"the page did not show, within {timeout_s:.0f} s: {js}")
        return handle.json_value()

    def screenshot(self, path: Path) -> list[Path]:
        """A full-page screenshot at ``path`` (and in ``$HIVEMESH_ARTIFACTS``)."""
        self.page.screenshot(path=str(path), full_page=True)
        return save_artifact(path, path.name)


@contextmanager
def open_browser() -> Iterator[Any]:
    """A headless system Chromium (Playwright's ``Browser``)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium_path(),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def open_page(url: str, *, width: int = 1400, height: int = 1100) -> Iterator[Browser]:
    """``url`` in a fresh page of a headless Chromium."""
    with open_browser() as browser:
        page = browser.new_page(viewport={"width": width, "height": height})
        watched = Browser(page)
        page.goto(url, timeout=30_000)
        yield watched
