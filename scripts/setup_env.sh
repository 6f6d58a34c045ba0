# Sourced by scripts/demo.sh and scripts/test.sh: installs what is missing
# (torch only when absent: a user's torch is never replaced), then builds the
# extension against that torch and installs this checkout in editable mode.
#
# An unchanged tree is not rebuilt: the build's inputs (csrc/, setup.py,
# pyproject.toml, the version file, the torch and Python it targets, the
# variables setup.py and the compiler read) are hashed into build/setup_env.stamp after each
# successful build; when the hash matches, the native library is there and
# $PY imports this checkout, the build step is skipped. Otherwise pip builds
# through ninja in setup.py's persistent object folder (build/obj-*), so a
# changed source recompiles only the translation units that include it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
PY=$("$PY" -c 'import sys; print(sys.executable)')   # absolute: used from other folders below
# The console scripts of $PY's environment (ninja among them), even when it is not activated.
PATH="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
export PATH

missing=$("$PY" - <<'EOF'
import importlib.metadata as md
import importlib.util
import shutil

def version_at_least(dist, major):
    try:
        return int(md.version(dist).split(".")[0]) >= major
    except (md.PackageNotFoundError, ValueError):
        return False

need = []
if importlib.util.find_spec("torch") is None:
    need.append("torch")
if not version_at_least("setuptools", 64):
    need.append("setuptools>=64")
for module, package in (("wheel", "wheel"), ("numpy", "numpy"), ("pytest", "pytest")):
    if importlib.util.find_spec(module) is None:
        need.append(package)
if not version_at_least("hypothesis", 6):  # the differential fuzz tests (tests/test_fuzz.py)
    need.append("hypothesis>=6.100")
if shutil.which("ninja") is None:
    need.append("ninja")
print(" ".join(need))
EOF
)
if [[ " $missing " == *" torch "* ]]; then
  # torch 2.13.0 is the CPU build this project's CI machines carry locally;
  # MLA_DECODE_TORCH="torch==X.Y" installs another one.
  echo "torch is not installed: installing ${MLA_DECODE_TORCH:-torch==2.13.0}"
  "$PY" -m pip install -q "${MLA_DECODE_TORCH:-torch==2.13.0}"
  missing=${missing//torch/}
fi
if [ -n "${missing// /}" ]; then
  echo "installing $missing"
  # shellcheck disable=SC2086  # one word per package
  "$PY" -m pip install -q $missing
fi

build_stamp() {
  {
    "$PY" - <<'EOF'
import importlib.metadata as md
import importlib.util
import os
import shutil
import sys

print(sys.executable, sys.version)
print("torch", md.version("torch"), importlib.util.find_spec("torch").origin)
for name in ("MLA_DECODE_CUDA", "MLA_DECODE_HIP", "MLA_DECODE_DEBUG", "MLA_DECODE_TRACE", "TORCH_CUDA_ARCH_LIST",
             "PYTORCH_ROCM_ARCH", "CUDA_HOME", "CUDA_PATH", "ROCM_HOME", "ROCM_PATH",
             "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS"):
    print(name, os.environ.get(name))
print("nvcc", shutil.which("nvcc"), "hipcc", shutil.which("hipcc"))
EOF
    find csrc setup.py pyproject.toml mla_decode/_version.py -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -d' ' -f1
}

stamp_file=build/setup_env.stamp
stamp=$(build_stamp)
# What $PY imports as mla_decode from outside this folder (the editable install's target).
imported=$(cd / && "$PY" -c 'import importlib.util as u; s = u.find_spec("mla_decode"); print(s.origin if s else "")' \
           2>/dev/null || true)
if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] && [ -f mla_decode/_build_info.py ] \
   && compgen -G "mla_decode/_C*.so" >/dev/null && [ "$imported" = "$PWD/mla_decode/__init__.py" ]; then
  echo "mla_decode: up to date (sources, torch and build settings unchanged since the last build): not rebuilding"
else
  echo "building mla_decode against torch $("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))')" \
       "(ninja: only what changed since the last build recompiles)"
  rm -f "$stamp_file"
  "$PY" -m pip install -q --no-build-isolation --no-deps -e .
  mkdir -p build
  echo "$stamp" > "$stamp_file"
fi
