"""The node's Ed25519 key file.

Theory of operation
-------------------
A node's identity is one 32-byte Ed25519 seed kept in ``<data_dir>/node.key``.

File format (48 bytes, binary)::

    b"hivemesh-ed25519"   16 bytes, magic and key type
    seed                  32 bytes, the Ed25519 private seed (RFC 8032)

Creation: the data dir is created with mode 0700 if missing; the seed comes
from :func:`secrets.token_bytes`; it is written to a temporary file opened
``O_CREAT | O_EXCL`` with mode 0600, fsync'ed, renamed into place and the
directory fsync'ed, so a crash leaves either no key file or a complete one
(never a torn key that would silently change the node's address). A new key
gets its own feed's mark, 0, beside it (:mod:`hivemesh.stores.feedmark`).

Loading refuses, with :class:`~hivemesh.errors.ConfigError` naming the file:

* a key file readable or writable by group or others (as ``ssh`` does;
  fix with ``chmod 600``) or owned by another user;
* a data dir writable by group or others (someone could swap the key);
* a file of the wrong length or without the magic.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from hivemesh.core.identity import Identity
from hivemesh.errors import ConfigError, StoreError
from hivemesh.stores.feedmark import create_mark

__all__ = ["KEY_FILE", "KEY_MAGIC", "load_identity", "load_or_create_identity"]

#: Name of the key file inside the data dir.
KEY_FILE = "node.key"
#: First bytes of every key file.
KEY_MAGIC = b"hivemesh-ed25519"
_SEED_LEN = 32
_FILE_LEN = len(KEY_MAGIC) + _SEED_LEN


def load_or_create_identity(data_dir: str | os.PathLike[str]) -> Identity:
    """Load the node identity from ``data_dir``, creating a new one if absent."""
    ddir = Path(data_dir)
    if not ddir.exists():
        try:
            ddir.mkdir(mode=0o700, parents=True)
        except FileExistsError:
            pass  # created concurrently; checked below
        except OSError as exc:
            raise ConfigError(f"cannot create data dir {ddir}: {exc}") from exc
    path = ddir / KEY_FILE
    created = False
    if not path.exists():
        _check_dir(ddir)
        _write_new(path)
        created = True
    identity = load_identity(ddir)
    if created:  # a new key's feed is empty: its mark is 0 (hivemesh.stores.feedmark)
        try:
            create_mark(ddir, identity.public)
        except (OSError, StoreError) as exc:
            raise ConfigError(f"cannot write the feed mark in {ddir}: {exc}") from exc
    return identity


def load_identity(data_dir: str | os.PathLike[str]) -> Identity:
    """Load the identity from ``data_dir``; :class:`ConfigError` if missing or unsafe."""
    ddir = Path(data_dir)
    _check_dir(ddir)
    path = ddir / KEY_FILE
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError as exc:
        raise ConfigError(f"no key file at {path}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot open key file {path}: {exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"key file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise ConfigError(
                f"key file {path} has mode {stat.S_IMODE(st.st_mode):04o}: it must not be "
                f"accessible by group or others (run: chmod 600 {path})"
            )
        if st.st_uid != os.getuid():
            raise ConfigError(f"key file {path} is owned by uid {st.st_uid}, not by us")
        data = os.read(fd, _FILE_LEN + 1)
    finally:
        os.close(fd)
    if len(data) != _FILE_LEN:
        raise ConfigError(f"key file {path} is {len(data)} bytes, want {_FILE_LEN}")
    if not data.startswith(KEY_MAGIC):
        raise ConfigError(f"key file {path} is not a hivemesh Ed25519 key (bad magic)")
    return Identity.from_seed(data[len(KEY_MAGIC) :])


def _check_dir(ddir: Path) -> None:
    try:
        st = ddir.stat()
    except OSError as exc:
        raise ConfigError(f"data dir {ddir} is not usable: {exc}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"data dir {ddir} is not a directory")
    if st.st_mode & 0o022:
        raise ConfigError(
            f"data dir {ddir} has mode {stat.S_IMODE(st.st_mode):04o}: it must not be "
            f"writable by group or others (run: chmod 700 {ddir})"
        )


def _write_new(path: Path) -> None:
    seed = secrets.token_bytes(_SEED_LEN)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)  # in case of an unusual umask
            view = memoryview(KEY_MAGIC + seed)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)  # no clobber: a concurrent creator wins, we load theirs
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise ConfigError(f"cannot write key file {path}: {exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
