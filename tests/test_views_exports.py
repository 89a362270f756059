"""The public surface of hivemesh.core.views changes only on purpose."""

from __future__ import annotations

import hivemesh.core.views as views
from hivemesh.core.views import View, standard_views


def test_exported_members() -> None:
    assert views.__all__ == sorted(views.__all__)
    assert set(views.__all__) == {
        "BlobFetcher",
        "BlobIndex",
        "Context",
        "ContextView",
        "MaxRegisterView",
        "NamesView",
        "View",
        "standard_views",
    }
    for name in views.__all__:
        assert getattr(views, name).__doc__


def test_standard_views_cover_distinct_kinds() -> None:
    vs = standard_views(b"\x01" * 32)
    kinds = [k for v in vs for k in v.kinds]
    assert len(kinds) == len(set(kinds))
    assert set(kinds) == {
        "ctx.update",
        "reg.max",
        "name.claim",
        "name.release",
        "blob.put",
        "witness",  # the names view orders claims by their witnesses (core.witness)
    }
    for v in vs:
        assert isinstance(v, View)
        assert len(v.digest()) == 32
        assert not v.rejected
