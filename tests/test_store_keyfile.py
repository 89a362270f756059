"""Node key file: created 0600 in a 0700 dir, stable, refused when unsafe."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hivemesh.core.identity import verify
from hivemesh.core.ownfeed import Mark
from hivemesh.errors import ConfigError
from hivemesh.stores.feedmark import MARK_FILE, FileMarkStore
from hivemesh.stores.keyfile import KEY_FILE, KEY_MAGIC, load_identity, load_or_create_identity


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_created_with_private_modes_and_reloaded(tmp_path: Path) -> None:
    ddir = tmp_path / "node" / "data"
    ident = load_or_create_identity(ddir)
    key = ddir / KEY_FILE
    assert mode(ddir) == 0o700
    assert mode(key) == 0o600
    assert key.read_bytes() == KEY_MAGIC + ident.seed()
    assert sorted(os.listdir(ddir)) == [MARK_FILE, KEY_FILE]  # no temp file left behind
    again = load_or_create_identity(ddir)
    assert again.public == ident.public and again.address == ident.address
    assert verify(again.public, ident.sign(b"m"), b"m")


def test_created_0600_even_with_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        load_or_create_identity(tmp_path / "d")
    finally:
        os.umask(old)
    assert mode(tmp_path / "d" / KEY_FILE) == 0o600
    assert mode(tmp_path / "d") == 0o700


def test_distinct_nodes_get_distinct_keys(tmp_path: Path) -> None:
    a = load_or_create_identity(tmp_path / "a")
    b = load_or_create_identity(tmp_path / "b")
    assert a.public != b.public


@pytest.mark.parametrize("bits", [0o640, 0o604, 0o660, 0o644, 0o700])
def test_group_or_other_access_is_refused(tmp_path: Path, bits: int) -> None:
    load_or_create_identity(tmp_path / "d")
    key = tmp_path / "d" / KEY_FILE
    key.chmod(bits)
    if bits & 0o077:
        with pytest.raises(ConfigError, match="chmod 600"):
            load_identity(tmp_path / "d")
    else:
        load_identity(tmp_path / "d")  # owner-only execute bit is harmless


@pytest.mark.parametrize("content", [b"", KEY_MAGIC, KEY_MAGIC + b"x" * 31, KEY_MAGIC + b"x" * 33])
def test_wrong_length_is_refused(tmp_path: Path, content: bytes) -> None:
    load_or_create_identity(tmp_path)
    (tmp_path / KEY_FILE).write_bytes(content)
    with pytest.raises(ConfigError, match="bytes, want 48"):
        load_or_create_identity(tmp_path)


def test_wrong_magic_is_refused(tmp_path: Path) -> None:
    load_or_create_identity(tmp_path)
    (tmp_path / KEY_FILE).write_bytes(b"x" * 48)
    with pytest.raises(ConfigError, match="magic"):
        load_identity(tmp_path)


def test_group_writable_data_dir_is_refused(tmp_path: Path) -> None:
    ddir = tmp_path / "d"
    load_or_create_identity(ddir)
    ddir.chmod(0o770)
    with pytest.raises(ConfigError, match="chmod 700"):
        load_identity(ddir)


def test_missing_key_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no key file"):
        load_identity(tmp_path)


def test_symlinked_key_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    load_or_create_identity(real)
    ddir = tmp_path / "d"
    ddir.mkdir(mode=0o700)
    (ddir / KEY_FILE).symlink_to(real / KEY_FILE)
    with pytest.raises(ConfigError):
        load_identity(ddir)


def test_data_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_bytes(b"")
    with pytest.raises(ConfigError):
        load_or_create_identity(f)


def test_concurrent_creators_agree_on_one_key(tmp_path: Path) -> None:
    import threading

    ddir = tmp_path / "d"
    got: list[bytes] = []
    errors: list[BaseException] = []

    def create() -> None:
        try:
            got.append(load_or_create_identity(ddir).public)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == [] and len(got) == 8 and len(set(got)) == 1
    assert sorted(os.listdir(ddir)) == [MARK_FILE, KEY_FILE]


def test_a_new_key_gets_mark_0_and_an_existing_key_keeps_its_mark(tmp_path: Path) -> None:
    ddir = tmp_path / "d"
    me = load_or_create_identity(ddir).public
    marks = FileMarkStore(ddir / MARK_FILE, me)
    assert marks.load() == Mark()  # a new feed is empty: the node writes at once
    marks.save(Mark(7, b"h" * 32))
    marks.close()
    assert load_or_create_identity(ddir).public == me
    assert FileMarkStore(ddir / MARK_FILE, me).load() == Mark(7, b"h" * 32)
