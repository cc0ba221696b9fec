"""Regenerate check_invariants' expected outputs in expected/ from the golden inputs, on purpose
only (`make golden`); the test compares against them and never writes them. Review the diff."""

from __future__ import annotations

import io
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))

from tests.test_check_invariants import CASES, EXPECTED  # noqa: E402
from vkit.cli import check_invariants  # noqa: E402


def main() -> int:
    os.chdir(HERE)  # the cases name their inputs relative to the golden directory
    os.makedirs(EXPECTED, exist_ok=True)
    for name, argv, _code, _findings in CASES:
        out, err = io.StringIO(), io.StringIO()
        check_invariants.main(["-q", *argv], stdout=out, stderr=err)
        if err.getvalue():
            print(f"{name}: {err.getvalue().strip()}", file=sys.stderr)
            return 1
        with open(os.path.join(EXPECTED, f"{name}.json"), "w", encoding="utf-8") as f:
            f.write(out.getvalue())
    out = io.StringIO()  # the seed's table for people (test_seed_table_golden)
    check_invariants.main(["aisbench_seed.json", "--human"], stdout=out, stderr=io.StringIO())
    with open(os.path.join(EXPECTED, "aisbench_seed.table.txt"), "w", encoding="utf-8") as f:
        f.write(out.getvalue())
    print(f"wrote {len(CASES) + 1} expected outputs to {EXPECTED}; review them with git diff", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
