#!/usr/bin/env bash
# The main job: installs what it needs, builds, then generates competition
# inputs, runs custom_kernel in each cache format and prints its accuracy
# (against exact math on the bf16 cache) and time; GPU if present, else CPU.
source "$(dirname "$0")/setup_env.sh"
"$PY" -m mla_decode demo "$@"
