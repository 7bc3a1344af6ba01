"""``python -m dynask.control_plane.cli``: the ``dynask`` command."""

import sys

from dynask.control_plane.cli.main import main

sys.exit(main())
