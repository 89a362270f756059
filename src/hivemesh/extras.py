"""Optional dependencies: what ``pip install hivemesh[EXTRA]`` adds, and the
error a node gives when a feature needs one that is not installed.

A plain node (``pip install hivemesh``) runs the journal, the views, the
mesh, the embedded lease quorum, telemetry *sending*, the demo and the
planner roles. The heavy engines are extras, imported only where used (so a
node that does not use them does not pay for them in memory either):

============  =================================================  ===========================
extra         packages                                           needed for
============  =================================================  ===========================
collector     duckdb, pyarrow                                    ``up --collector`` (the
                                                                 metrics store), telemetry
                                                                 benches
otlp          opentelemetry-api, -sdk, -exporter-otlp-proto-http  the ``otlp`` metrics sink
nats          nats-py                                            ``nats://`` lease backend
redis         redis                                              ``redis://`` lease backend
mcp           mcp                                                MCP tools and servers
web           lxml, mcp                                          ``hivemesh webtools``
all           every extra above
============  =================================================  ===========================
"""

from __future__ import annotations

from hivemesh.errors import ConfigError

__all__ = ["EXTRA_OF", "missing"]

#: Top-level module -> the extra that installs it.
EXTRA_OF: dict[str, str] = {
    "duckdb": "collector",
    "pyarrow": "collector",
    "opentelemetry": "otlp",
    "nats": "nats",
    "redis": "redis",
    "mcp": "mcp",
    "lxml": "web",
}


def missing(exc: ModuleNotFoundError, what: str) -> ConfigError | ModuleNotFoundError:
    """The error to raise for ``exc`` while starting ``what``: a
    :class:`ConfigError` naming the extra to install, if the missing module
    belongs to one (else ``exc`` itself: a real bug, not a missing extra)."""
    top = (exc.name or "").partition(".")[0]
    extra = EXTRA_OF.get(top)
    if extra is None:
        return exc
    return ConfigError(f"{what} needs {top}, not installed: pip install 'hivemesh[{extra}]'")
