"""Where formcast keeps files it builds once and reuses: converted models, tokenizers.

``$FORMCAST_CACHE/<sub>`` or ``~/.cache/formcast/<sub>``. ``grammar`` reads the same variable for
its vocabulary tables (``grammar.vocab``), so one setting moves every cache.
"""

from __future__ import annotations

import os
from pathlib import Path


def formcast_cache_dir(sub: str) -> Path:
    """``$FORMCAST_CACHE/<sub>`` or ``~/.cache/formcast/<sub>`` (not created here)."""
    root = os.environ.get("FORMCAST_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "formcast"
    return base / sub
