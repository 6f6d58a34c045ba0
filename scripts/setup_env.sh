# Sourced by scripts/demo.sh and scripts/test.sh: installs what is missing
# (torch only when absent: a user's torch is never replaced), then builds the
# extension in place against that torch.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  # torch 2.13.0 is the CPU build this project's CI machines carry locally;
  # override with MLA_DECODE_TORCH="torch==X.Y" for another one.
  echo "torch is not installed: installing ${MLA_DECODE_TORCH:-torch==2.13.0}"
  "$PY" -m pip install -q "${MLA_DECODE_TORCH:-torch==2.13.0}"
fi
"$PY" -m pip install -q "setuptools>=64" wheel ninja numpy pytest
# Always (re)build: ninja makes an unchanged tree cheap, and a stale binary
# must never be what gets tested.
echo "building mla_decode against torch $("$PY" -c 'import torch; print(torch.__version__)')"
"$PY" -m pip install -q --no-build-isolation --no-deps -e .
