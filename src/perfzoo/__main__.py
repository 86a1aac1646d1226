"""``python -m perfzoo``: the ``perfzoo`` command line."""

import sys

from perfzoo.cli import main

sys.exit(main())
