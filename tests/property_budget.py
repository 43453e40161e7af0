"""How many examples a property test draws: its base count times ``FORMCAST_EXAMPLES_SCALE``.

CI and ``make test`` use the base counts (and CI a fixed seed, see ``conftest``); ``make
test-random`` scales them up and draws fresh random seeds, to look beyond the examples CI sees.
"""

from __future__ import annotations

import os


def examples(base: int) -> int:
    return base * max(1, int(os.environ.get("FORMCAST_EXAMPLES_SCALE", "1")))
