#!/usr/bin/env bash
# The test command: installs what it needs, builds, runs the whole suite
# (GPU tests run when a GPU is present, and are skipped otherwise).
source "$(dirname "$0")/setup_env.sh"
"$PY" -m pytest -q -p no:cacheprovider tests "$@"
