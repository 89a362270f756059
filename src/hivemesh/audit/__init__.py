"""The 50-shop price audit: the seed use case of hivemesh.

* :mod:`hivemesh.audit.world` -- the fixture world from a seed (pure);
* :mod:`hivemesh.audit.pages` -- the shops' HTML;
* :mod:`hivemesh.audit.market` -- the fenced "market database";
* :mod:`hivemesh.audit.server` -- the local HTTP server that serves them
  (``hivemesh fixture shops``).
"""
