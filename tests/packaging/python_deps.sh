#!/usr/bin/env bash
# What `pip install .` relies on to build every backend, checked by configuring (not
# building) the package the way scikit-build-core does, with a Python environment made here:
#   - a cuDNN wheel in the environment (nvidia/cudnn, as nvidia-cudnn-cu13 installs it) is
#     found with no STRIDEATTN_CUDNN_ROOT, and the wheel's GPU module reaches it through an
#     RPATH relative to itself ($ORIGIN/../nvidia/cudnn/lib), not the build machine's path;
#   - a dropped cudnn backend is a CMake WARNING (what pip -v shows) and the configure summary
#     names the reason.
# The cuDNN "wheel" holds empty placeholder files: a configure only looks for them.
# Usage: python_deps.sh SOURCE_DIR WORK_DIR PYTHON_WITH_NANOBIND
set -uo pipefail
src=$1 work=$2 host_python=$3
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

"$host_python" -c 'import nanobind' 2>/dev/null ||
  { echo "FAIL: '$host_python' has no nanobind (scripts/setup installs it in .venv)"; exit 1; }
rm -rf "$work"
mkdir -p "$work"
python3 -m venv --without-pip "$work/env" || { echo "FAIL: python3 -m venv"; exit 1; }
site=$("$work/env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
# nanobind and the cuDNN frontend headers come from the host environment (as from pip's build
# environment); the cuDNN wheel lives in the new environment itself.
"$host_python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])' >"$site/host.pth"
mkdir -p "$site/nvidia/cudnn/include" "$site/nvidia/cudnn/lib"
touch "$site/nvidia/cudnn/include/cudnn.h" "$site/nvidia/cudnn/lib/libcudnn.so.9"

configure() {  # build dir, extra cmake arguments
  local dir=$1; shift
  cmake -S "$src" -B "$work/$dir" -G Ninja -DSTRIDEATTN_TESTS=OFF -DSTRIDEATTN_TOOLS=OFF \
    -DSTRIDEATTN_PYTHON=ON -DPython_EXECUTABLE="$work/env/bin/python" \
    -DCMAKE_CUDA_ARCHITECTURES=90a-real "$@" 2>&1
}

out=$(configure wheel)
if grep -q "cudnn      ON  ($site/nvidia/cudnn/lib/libcudnn.so.9" <<<"$out"; then
  ok "cuDNN found in the environment: $(grep -m1 'cudnn      ON' <<<"$out" | tr -s ' ')"
else
  fail "cuDNN of the environment not found:"; grep -A6 'configure summary' <<<"$out"
fi
if grep -q 'GPU module RPATH \$ORIGIN;\$ORIGIN/../nvidia/cudnn/lib;' <<<"$out" &&
   ! grep 'GPU module RPATH' <<<"$out" | grep -q "$site"; then
  ok "$(grep -m1 'GPU module RPATH' <<<"$out")"
else
  fail "the module's RPATH is not relative to the wheel's nvidia/cudnn/lib: $(grep 'GPU module RPATH' <<<"$out")"
fi

out=$(configure dropped -DSTRIDEATTN_CUDNN_FRONTEND_INCLUDE="$work/no-such-dir")
if grep -q 'CMake Warning' <<<"$out" && grep -q 'strideattn: cudnn backend OFF: cudnn_frontend.h not found' <<<"$out" &&
   grep -q "cudnn      OFF (cudnn_frontend.h not found" <<<"$out"; then
  ok "dropped cudnn: a WARNING and the summary line: $(grep -m1 'cudnn      OFF' <<<"$out" | tr -s ' ')"
else
  fail "dropped cudnn without a WARNING and a summary line:"; grep -B2 -A8 'Warning' <<<"$out" | head -20
fi

((fails == 0)) || { echo "$fails check(s) failed"; exit 1; }
echo "all python dependency checks passed"
