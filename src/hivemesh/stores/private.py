"""Private files: a node's data dir is 0700 and every file in it 0600.

Theory of operation
-------------------
A data dir holds the node's secret key, its journal, its inbox, spooled
telemetry and lease state: nothing in it is for anyone but the node's user.
Two rules keep it so, whatever the umask:

* **What the node creates is created private.** :func:`create_private`
  makes an empty 0600 file before a library opens it (SQLite gives a
  database's ``-wal``, ``-shm`` and ``-journal`` files the database file's
  own mode, so a 0600 ``store.db`` has 0600 companions);
  :func:`write_private` writes a small file whole (a 0600 temporary file,
  fsync'ed and renamed into place); :func:`open_private` is ``os.open`` with
  mode 0600. Modes are given to ``open(2)``, never left to the umask.
* **What is already there is tightened, loudly.** :func:`secure_data_dir`
  creates the dir 0700 if missing; if it exists (made beforehand with a
  looser mode, restored from a backup, copied with ``cp -r``), it sets the
  dir to 0700 and everything in it to 0600 (directories 0700) and returns
  what it changed, for the caller to log as a warning. It never follows a
  symbolic link and leaves alone what another user owns (the key file check
  in :mod:`hivemesh.stores.keyfile` refuses a foreign key).

Failures to change a mode raise :class:`~hivemesh.errors.ConfigError`
naming the path: a data dir we cannot make private is not used.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from hivemesh.errors import ConfigError

__all__ = [
    "PRIVATE_DIR",
    "PRIVATE_FILE",
    "create_private",
    "made_private",
    "open_private",
    "secure_data_dir",
    "write_private",
]

#: Mode of the data dir and any directory in it.
PRIVATE_DIR = 0o700
#: Mode of every file in the data dir.
PRIVATE_FILE = 0o600


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open(path, flags)``; a file it creates gets mode 0600."""
    return os.open(path, flags | os.O_CLOEXEC, PRIVATE_FILE)


def create_private(path: str | os.PathLike[str]) -> None:
    """Create ``path`` empty with mode 0600 unless it exists (then it is left as is)."""
    with contextlib.suppress(FileExistsError):
        os.close(open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL))


def write_private(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically, mode 0600, fsync'ed."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def secure_data_dir(path: str | os.PathLike[str]) -> list[str]:
    """Make ``path`` 0700 and everything in it private (see module docs).

    Returns one note per change, e.g. ``"store.db 0644 -> 0600"``; empty if
    nothing was loose.
    """
    root = Path(path)
    try:
        root.mkdir(mode=PRIVATE_DIR, parents=True)
        return []  # new: nothing in it yet
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(f"cannot create data dir {root}: {exc}") from exc
    if not root.is_dir():
        raise ConfigError(f"data dir {root} is not a directory")
    notes: list[str] = []
    _tighten(root, ".", PRIVATE_DIR, notes, follow=True)
    for dirpath, dirnames, filenames in os.walk(root):  # never follows symlinks
        base = Path(dirpath)
        for name in sorted(dirnames):
            _tighten(base / name, _rel(root, base / name), PRIVATE_DIR, notes)
        for name in sorted(filenames):
            _tighten(base / name, _rel(root, base / name), PRIVATE_FILE, notes)
    return notes


def _rel(root: Path, p: Path) -> str:
    return str(p.relative_to(root))


def _tighten(p: Path, label: str, mode: int, notes: list[str], *, follow: bool = False) -> None:
    try:
        st = os.stat(p, follow_symlinks=follow)
    except FileNotFoundError:
        return  # removed meanwhile
    except OSError as exc:
        raise ConfigError(f"cannot inspect {p}: {exc}") from exc
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid():
        return
    have = stat.S_IMODE(st.st_mode)
    if not have & 0o077:
        return
    try:
        os.chmod(p, mode)
    except OSError as exc:
        raise ConfigError(f"cannot make {p} private (chmod {mode:o}): {exc}") from exc
    notes.append(f"{label} {have:04o} -> {mode:04o}")


def made_private(data_dir: str | os.PathLike[str], notes: list[str]) -> str:
    """The warning for what :func:`secure_data_dir` changed."""
    exposed = any(note.startswith("node.key ") for note in notes)
    return f"data dir {data_dir} was open to other users; made private: {', '.join(notes)}" + (
        " (the identity key was readable by others)" if exposed else ""
    )
