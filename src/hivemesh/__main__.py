"""``python -m hivemesh`` runs the CLI."""

import sys

from hivemesh.faces.cli import main

sys.exit(main())
