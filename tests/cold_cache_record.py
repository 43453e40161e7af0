"""The cold half of ``test_compile_cache``'s empty-numba-cache check, and ``make test``'s warm-up.

``python tests/cold_cache_record.py RECORD`` runs in a fresh interpreter on whatever numba cache
``NUMBA_CACHE_DIR`` names. On a cold cache (a fresh clone, every CI run) it warms it as
``python -m grammar.jit_warmup`` does (the warm-up's child processes compile into it), then
compiles ``test_compile_cache.CONSTRAINTS`` in this process, which loads what the children wrote
and compiles whatever they did not, and writes RECORD: the constraints' mask fingerprints and the
census of compiled kernel versions. On a warm cache it only removes a stale RECORD.

Why a record: the check needs one interpreter that starts on an empty cache, and the test command
starts on one anyway on a fresh machine. The test reads the record that its own test command
wrote (``FORMCAST_COLD_CACHE_RECORD``) and otherwise runs this script on an empty temporary cache
itself; either way the same assertions judge a genuinely cold start. Exit status: 0, or 1 when
the warm-up's children failed (the suite then compiles on first use, as before).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(record: Path) -> int:
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from grammar import jit_warmup

    if jit_warmup.is_warm():
        record.unlink(missing_ok=True)
        return 0
    if not jit_warmup.warm_up_now(progress=lambda line: print(line, file=sys.stderr, flush=True)):
        record.unlink(missing_ok=True)
        return 1
    import test_compile_cache as t

    out = {c.digest: t._fingerprint(t._fresh(c, disk=None)) for c in t.CONSTRAINTS}
    record.parent.mkdir(parents=True, exist_ok=True)
    census = {"fingerprints": out, "signatures": jit_warmup.compiled_signatures(), "warm_after": jit_warmup.is_warm()}
    record.write_text(json.dumps(census))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
