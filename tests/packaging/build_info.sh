#!/usr/bin/env bash
# build_config.json, the record behind strideattn.build_info() and `python -m strideattn
# info`, says for each configure what was built, what was asked for and why a backend is
# missing, in the configure summary's words. Configures (does not build) the wheel's
# project the way scikit-build-core does, once per case:
#   - CPU-only on purpose (STRIDEATTN_CUDA=OFF): cuda/cudnn not built, not asked for;
#   - no CUDA compiler to be found (the GPU machine whose user did not get the cuda
#     backend): cuda asked for, not built, "no CUDA compiler found";
#   - no nlohmann/json.hpp in a wheel build: the CLI off with the reason, a WARNING;
#   - (with nvcc) the cuDNN frontend missing: cuda built, cudnn asked for, not built, the
#     frontend named; and everything found: all four built, the toolkit and cuDNN named.
# Usage: build_info.sh SOURCE_DIR WORK_DIR PYTHON_WITH_NANOBIND HAVE_CUDA(ON|OFF)
set -uo pipefail
src=$1 work=$2 python=$3 have_cuda=$4
fails=0
rm -rf "$work"
mkdir -p "$work"

configure() {  # case name, then cmake arguments; prints the configure output
  cmake -S "$src" -B "$work/$1" -G Ninja -DSTRIDEATTN_TESTS=OFF -DSTRIDEATTN_TOOLS=ON \
    -DSTRIDEATTN_PYTHON=ON -DSKBUILD=2 -DSKBUILD_SCRIPTS_DIR="$work/$1/scripts" \
    -DPython_EXECUTABLE="$python" -DCMAKE_CUDA_ARCHITECTURES=90a-real "${@:2}" 2>&1
}

expect() {  # case name, configure output, python assertions on `b` (backends) and `cli`
  local name=$1 out=$2 checks=$3 json=$work/$1/python/build_config.json
  if [[ ! -f $json ]]; then
    echo "FAIL ($name): no $json; configure said:"; tail -20 <<<"$out"; fails=$((fails + 1)); return
  fi
  if "$python" - "$json" "$checks" <<'EOF'; then
import json, sys
info = json.load(open(sys.argv[1]))
b, cli = info["backends"], info["cli"]
assert set(b) == {"reference", "cpu", "cuda", "cudnn"}, b
assert all(b[n]["built"] and b[n]["requested"] for n in ("reference", "cpu")), b
for n, e in b.items():  # a reason exactly when not built
    assert bool(e["reason"]) != e["built"], (n, e)
exec(sys.argv[2])
EOF
    echo "ok ($name): cuda=$(grep -o '"cuda": {[^}]*}' "$json") cudnn=$(grep -o '"cudnn": {[^}]*}' "$json" | cut -c1-160)"
  else
    echo "FAIL ($name): $(cat "$json")"; fails=$((fails + 1))
  fi
}

out=$(configure cpu_only -DSTRIDEATTN_CUDA=OFF)
expect cpu_only "$out" '
assert not b["cuda"]["built"] and not b["cuda"]["requested"], b["cuda"]
assert b["cuda"]["reason"] == "configured with STRIDEATTN_CUDA=OFF", b["cuda"]
assert not b["cudnn"]["built"] and not b["cudnn"]["requested"], b["cudnn"]
assert cli["built"] and not cli["reason"], cli'

# no nvcc on PATH, CUDACXX unset: what a user without the toolkit on PATH gets by default
out=$(env -u CUDACXX PATH="$(dirname "$(command -v cmake)"):/usr/bin:/bin" bash -c \
      "$(declare -f configure); work='$work' src='$src' python='$python' configure no_compiler")
expect no_compiler "$out" '
assert not b["cuda"]["built"] and b["cuda"]["requested"], b["cuda"]
assert b["cuda"]["reason"].startswith("no CUDA compiler found at configure time"), b["cuda"]
assert not b["cudnn"]["built"] and b["cudnn"]["requested"], b["cudnn"]
assert "no CUDA compiler found" in b["cudnn"]["reason"], b["cudnn"]'

# a wheel build that finds no nlohmann/json.hpp still configures, without the CLI
out=$(configure no_json -DSTRIDEATTN_CUDA=OFF -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON \
      "-DCMAKE_IGNORE_PATH=/usr/include;/usr/local/include;$src/.deps/include")
if grep -q "CMake Warning" <<<"$out" && grep -q "strideattn CLI is OFF: nlohmann/json.hpp not found" <<<"$out"; then
  echo "ok (no_json): a WARNING names the missing header"
else
  echo "FAIL (no_json): no WARNING for the CLI left out:"; tail -20 <<<"$out"; fails=$((fails + 1))
fi
expect no_json "$out" '
assert not cli["built"] and cli["reason"].startswith("nlohmann/json.hpp not found"), cli'

if [[ $have_cuda == ON ]]; then
  out=$(configure no_frontend -DSTRIDEATTN_CUDNN_FRONTEND_INCLUDE="$work/no-such-dir")
  expect no_frontend "$out" '
assert b["cuda"]["built"] and "CUDA " in b["cuda"]["detail"] and "90a-real" in b["cuda"]["detail"], b
assert not b["cudnn"]["built"] and b["cudnn"]["requested"], b["cudnn"]
assert b["cudnn"]["reason"].startswith("cudnn_frontend.h not found in STRIDEATTN_CUDNN_FRONTEND_INCLUDE"), b'
  out=$(configure everything)
  expect everything "$out" '
assert all(e["built"] and e["requested"] for e in b.values()), b
assert "libcudnn" in b["cudnn"]["detail"] and "frontend" in b["cudnn"]["detail"], b["cudnn"]'
fi

((fails == 0)) || { echo "$fails case(s) failed"; exit 1; }
echo "all build_info cases passed"
