"""``python -m engine ...``: the ``formcast`` command line."""

import sys

from .entrypoints.cli import main

sys.exit(main())
