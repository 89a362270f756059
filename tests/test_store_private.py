"""Private files in the data dir (hivemesh.stores.private), on a real file system."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hivemesh.stores.private import (
    create_private,
    made_private,
    secure_data_dir,
    write_private,
)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def test_a_new_dir_is_created_private(tmp_path: Path) -> None:
    d = tmp_path / "x" / "node"
    assert secure_data_dir(d) == []
    assert mode(d) == 0o700


def test_loose_modes_are_tightened_and_reported_symlinks_left_alone(tmp_path: Path) -> None:
    d = tmp_path / "node"
    d.mkdir()
    (d / "store.db").write_bytes(b"")
    (d / "sub").mkdir()
    (d / "sub" / "blob").write_bytes(b"")
    (d / "fine").write_bytes(b"")
    outside = tmp_path / "outside"
    outside.write_bytes(b"")
    (d / "link").symlink_to(outside)
    for p, m in (
        (d, 0o755),
        (d / "store.db", 0o644),
        (d / "sub", 0o775),
        (d / "sub" / "blob", 0o666),
    ):
        p.chmod(m)
    (d / "fine").chmod(0o600)
    outside.chmod(0o644)
    notes = secure_data_dir(d)
    assert notes == [
        ". 0755 -> 0700",
        "sub 0775 -> 0700",
        "store.db 0644 -> 0600",
        "sub/blob 0666 -> 0600",
    ]
    assert mode(d) == mode(d / "sub") == 0o700
    assert mode(d / "store.db") == mode(d / "sub" / "blob") == mode(d / "fine") == 0o600
    assert mode(outside) == 0o644  # never through a symlink
    assert secure_data_dir(d) == []  # idempotent
    assert "identity key" in made_private(d, ["node.key 0644 -> 0600"])
    assert "identity key" not in made_private(d, notes)


def test_files_are_created_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        create_private(tmp_path / "a.db")
        write_private(tmp_path / "b.json", b"{}")
        write_private(tmp_path / "b.json", b"[]")  # replaced whole
    finally:
        os.umask(old)
    assert mode(tmp_path / "a.db") == mode(tmp_path / "b.json") == 0o600
    assert (tmp_path / "b.json").read_bytes() == b"[]"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.db", "b.json"]  # no temp left
    (tmp_path / "a.db").write_bytes(b"kept")
    create_private(tmp_path / "a.db")  # exists: left as it is
    assert (tmp_path / "a.db").read_bytes() == b"kept"
