#!/usr/bin/env bash
# The installed C++ package, as a CPU-only consumer sees it: `cmake --install` to a fresh
# prefix, a project that uses find_package(strideattn) builds against it and runs on the cpu
# backend, and
#   - neither the consumer nor the core (libstrideattn, libstrideattn_c) has a NEEDED entry
#     for libcudart, libcudnn or libnvrtc, and the exported targets name no absolute path;
#   - the libraries carry versioned SONAMEs: libstrideattn.so.0 -> libstrideattn.so.0.1.0;
#   - with a GPU module installed: explain() reports the module loaded (the cuda verdict is
#     about the device, not the module), and with the module removed or corrupt the consumer
#     still runs on cpu while the cuda verdict names the module file and dlerror's text;
#     without one (CPU-only build): the verdict says the build has no CUDA.
# Usage: check_install.sh BUILD_DIR CONSUMER_SOURCE WORK_DIR HAVE_GPU_MODULE(ON|OFF)
set -uo pipefail
build=$1 consumer=$2 work=$3 have_gpu=$4
prefix=$work/prefix
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; echo "FAIL: cmake --install"; exit 1; }
libdir=$(dirname "$(find "$prefix" -name 'libstrideattn.so.0' | head -n1)")
[[ -d $libdir ]] || { echo "FAIL: no libstrideattn.so.0 under $prefix"; find "$prefix"; exit 1; }
cmake -S "$consumer" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" 2>&1 &&
  cmake --build "$work/build" >"$work/build.log" 2>&1 ||
  { cat "$work/configure.log" "$work/build.log" | tail -30; echo "FAIL: consumer build"; exit 1; }
exe=$work/build/consumer

# --- runs on cpu, with no library path help
if out=$(env -u LD_LIBRARY_PATH "$exe" 2>&1); then ok "consumer runs: $out"; else fail "consumer: $out"; fi

# --- no CUDA library among the NEEDED entries
for f in "$exe" "$libdir/libstrideattn.so.0" "$libdir/libstrideattn_c.so.0"; do
  needed=$(readelf -d "$f" | grep NEEDED)
  if [[ -z $needed ]]; then
    fail "readelf -d $f shows no NEEDED entries at all"
  elif grep -Eq 'libcudart|libcudnn|libnvrtc|libcuda\.' <<<"$needed"; then
    fail "$(basename "$f") needs CUDA libraries: $(grep -E 'cud|nvrtc' <<<"$needed" | tr -s ' ')"
  else
    ok "$(basename "$f"): no CUDA library in NEEDED ($(grep -c NEEDED <<<"$needed") entries)"
  fi
done

# --- versioned SONAMEs and the links that go with them
for name in libstrideattn libstrideattn_c; do
  real=$libdir/$name.so.0.1.0
  soname=$(readelf -d "$real" 2>/dev/null | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
  if [[ -f $real && ! -L $real && $soname == "$name.so.0" &&
        $(readlink "$libdir/$name.so.0") == "$name.so.0.1.0" &&
        $(readlink "$libdir/$name.so") == "$name.so.0" ]]; then
    ok "$name.so -> $name.so.0 -> $name.so.0.1.0 (SONAME $soname)"
  else
    fail "$name: expected $name.so -> $name.so.0 -> $name.so.0.1.0 with SONAME $name.so.0; found" \
         "SONAME '$soname', $(cd "$libdir" && ls -l "$name".so* 2>&1 | awk '{print $9, $10, $11}' | tr '\n' ' ')"
  fi
done

# --- exported targets: nothing absolute, nothing CUDA
targets=$(cat "$libdir"/cmake/strideattn/strideattnTargets*.cmake)
bad=$(grep -E 'INTERFACE_(LINK_LIBRARIES|INCLUDE_DIRECTORIES)|IMPORTED_LOCATION' <<<"$targets" |
      grep -v '\${_IMPORT_PREFIX}' | grep -E '"/|;/' )
cudaref=$(grep -Ei 'cudnn|cudart|nvrtc|CUDA::' <<<"$targets")
if [[ -n $bad || -n $cudaref ]]; then
  fail "exported targets name absolute paths or CUDA libraries: $bad $cudaref"
else
  ok "exported targets: paths relative to the prefix, no CUDA library"
fi

# --- the GPU module
verdict() { env -u LD_LIBRARY_PATH "$exe" explain 2>&1 | grep "^$1: "; }
module=$libdir/libstrideattn_gpu.so.0
if [[ $have_gpu == ON ]]; then
  if [[ -e $module ]]; then ok "GPU module installed: $module"; else fail "no $module installed"; fi
  v=$(verdict cuda)
  if [[ -n $v && $v != *"module"* ]]; then ok "module loads; $v"; else fail "cuda verdict with the module in place: '$v'"; fi
  mv "$module" "$work/moved-module"
  v=$(verdict cuda)
  if [[ $v == *"is unavailable"*"$module"*"cannot open shared object file"* ]]; then
    ok "module absent; $v"
  else
    fail "cuda verdict with the module absent does not name it and dlerror: '$v'"
  fi
  if out=$(env -u LD_LIBRARY_PATH "$exe" 2>&1); then ok "runs on cpu without the module"; else fail "without the module: $out"; fi
  echo "not a shared object" >"$module"
  v=$(verdict cudnn)
  if [[ $v == *"is unavailable"*"$module"*"could not be loaded"* ]]; then
    ok "module corrupt; $v"
  else
    fail "cudnn verdict with a corrupt module: '$v'"
  fi
  mv -f "$work/moved-module" "$module"
else
  [[ ! -e $module ]] || fail "CPU-only build installed a GPU module"
  v=$(verdict cuda)
  if [[ $v == *"not part of this build (built without CUDA"* ]]; then ok "$v"; else fail "cuda verdict: '$v'"; fi
fi

((fails == 0)) || { echo "$fails check(s) failed"; exit 1; }
echo "all install checks passed"
