"""python -m mla_decode.bench [flags]: the same as python -m mla_decode bench."""

import sys

from . import main

sys.exit(main())
