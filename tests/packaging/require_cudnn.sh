#!/usr/bin/env bash
# STRIDEATTN_REQUIRE_CUDNN=ON must stop the configure, with a reason, whenever the cudnn
# backend cannot be built: here without CUDA at all, and (when this machine has nvcc) with a
# cuDNN frontend directory that does not exist.
# Usage: require_cudnn.sh SOURCE_DIR WORK_DIR HAVE_CUDA(ON|OFF)
set -uo pipefail
src=$1 work=$2 have_cuda=$3
expect_refusal() {  # name, then cmake arguments
  local name=$1; shift
  rm -rf "$work/$name"
  local out
  if out=$(cmake -S "$src" -B "$work/$name" -G Ninja -DSTRIDEATTN_TESTS=OFF -DSTRIDEATTN_TOOLS=OFF \
             -DSTRIDEATTN_REQUIRE_CUDNN=ON "$@" 2>&1); then
    echo "FAIL ($name): configure succeeded"; return 1
  fi
  if ! grep -q "STRIDEATTN_REQUIRE_CUDNN=ON but the cudnn backend is OFF" <<<"$out"; then
    echo "FAIL ($name): configure failed without the expected reason:"; echo "$out" | tail -20
    return 1
  fi
  echo "ok ($name): $(grep -m1 -A1 'STRIDEATTN_REQUIRE_CUDNN=ON but' <<<"$out" | tr -s ' ' | tr '\n' ' ')"
}
rc=0
expect_refusal no_cuda -DSTRIDEATTN_CUDA=OFF || rc=1
if [[ $have_cuda == ON ]]; then
  expect_refusal no_frontend -DSTRIDEATTN_CUDNN_FRONTEND_INCLUDE="$work/does-not-exist" || rc=1
fi
exit $rc
