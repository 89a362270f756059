"""One module per ``hivemesh`` subcommand (see :mod:`hivemesh.faces.cli`)."""
