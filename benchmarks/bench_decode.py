#!/usr/bin/env python3
"""The mla_decode benchmark, from a source checkout: the same as

    python -m mla_decode bench [flags]        (--help lists every flag)

The benchmark itself is the package module mla_decode.bench, so an installed
wheel has it too; this file only runs it (benchmarks/README.md describes it).
"""

import sys
from pathlib import Path

# The package of this checkout (built in place), ahead of any installed copy.
_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "mla_decode" / "__init__.py").exists():
    sys.path.insert(0, str(_CHECKOUT))
from mla_decode.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
