"""``python -m engine ...``: the ``formcast`` command line."""

import sys

from .cli import main

sys.exit(main())
