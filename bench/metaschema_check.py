"""The node-by-node metaschema check against jsonschema's whole-document check, on every MaskBench
schema: for each schema and each draft it may be read as (its own, and draft 7, the fallback for
schemas without ``$schema``), count the schemas the fast check passes but the metaschema refuses
(must be 0), the valid ones it sends to the slow check, and the time each check takes.

    python bench/metaschema_check.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))
sys.path.append(str(ROOT / "bench"))

from maskbench import DEFAULT_INPUT, load_records  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    args = ap.parse_args()

    import jsonschema
    from jsonschema import validators

    from grammar.json_schema import refs

    records = load_records(args.input, 0, None, None, 0)
    unsound = slow_path = refused = checks = 0
    fast_s = full_s = 0.0
    for record in records:
        schema = record["schema"]
        own = validators.validator_for(schema, default=jsonschema.Draft202012Validator) if isinstance(schema, dict) else jsonschema.Draft202012Validator
        for cls in {own, jsonschema.Draft7Validator}:
            checks += 1
            t0 = time.perf_counter()
            fast = refs._valid_node_by_node(cls, schema)
            t1 = time.perf_counter()
            full = refs._meta_validator(cls).is_valid(schema)
            t2 = time.perf_counter()
            fast_s, full_s = fast_s + t1 - t0, full_s + t2 - t1
            refused += not full
            if fast and not full:
                unsound += 1
                print(f"UNSOUND: {record['id']} as {cls.__name__}")
            slow_path += full and not fast
    print(f"{len(records)} schemas, {checks} (schema, draft) checks: {refused} refused by the metaschema, "
          f"{unsound} passed node by node but refused (must be 0), {slow_path} valid sent to the whole-document check")
    print(f"node by node {fast_s:.1f} s (verdicts cached across schemas), whole document {full_s:.1f} s")


if __name__ == "__main__":
    main()
