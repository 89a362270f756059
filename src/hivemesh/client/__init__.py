"""hivemesh.client: what talks to a running node from outside its process.

None of this runs inside the daemon (:mod:`hivemesh.runtime`, the asyncio
driver around the Peer); it is the other end of the control socket.

* :mod:`~hivemesh.client.blocking` -- :class:`Client`, the blocking
  control-socket client (the CLI, scripts, tests);
* :mod:`~hivemesh.client.aio` -- :class:`AsyncClient`, its asyncio twin (the
  MCP server, the HTTP faces);
* :mod:`~hivemesh.client.cli` -- the CLI's common options, output shapes
  and exit codes;
* :mod:`~hivemesh.client.swarm` -- :class:`LocalSwarm`, a local swarm of real
  node processes (tests, demos, benchmarks);
* :mod:`~hivemesh.client.demo` -- ``hivemesh demo``.

The wire form both ends share is :mod:`hivemesh.commands.wire`. This package
imports nothing at import time, so ``hivemesh status`` stays quick.
"""
