#!/usr/bin/env bash
# The Python package as a user installs it: a fresh virtual environment, `pip install .` with
# build isolation (the build requirements pinned in pyproject.toml come from PyPI, nothing
# from the repository's .venv), then what the user has (user_install_check.py): attention on
# strided views against numpy, build_info(), `python -m strideattn info`, the CLI script and
# `python -m strideattn` running it, the typing files. Here also: the wheel holds the CLI as a
# script and no C++ headers or CMake package, and the CLI finds the core relative to itself.
# Usage: user_install.sh SOURCE_DIR WORK_DIR EXPECT_CUDA(ON|OFF) [pip install arguments...]
#   WORK_DIR/build is scikit-build-core's build directory (kept: a rerun rebuilds changes).
set -uo pipefail
src=$1 work=$2 expect_cuda=$3
shift 3
fail() { echo "FAIL: $*"; exit 1; }

mkdir -p "$work"
rm -rf "$work/env"
python3 -m venv "$work/env" || fail "python3 -m venv (Debian: apt install python3-venv)"
py=$work/env/bin/python
start=$SECONDS
# --config-settings, not -C: Debian 12's venv has pip 23.0, which lacks the short option.
if ! "$py" -m pip install --disable-pip-version-check --config-settings=build-dir="$work/build" \
     "$@" "$src" >"$work/pip.log" 2>&1; then
  tail -40 "$work/pip.log"
  fail "pip install $* $src (log: $work/pip.log)"
fi
echo "ok: pip install . into a fresh venv with build isolation in $((SECONDS - start)) s" \
     "(pip $("$py" -m pip --version | cut -d' ' -f2))"

site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
record=$(cat "$site"/strideattn-*.dist-info/RECORD) || fail "no RECORD of the installed wheel"
grep -q '^\.\./\.\./\.\./bin/strideattn,' <<<"$record" ||
  fail "the wheel has no bin/strideattn script: $(grep -v '^strideattn/' <<<"$record")"
! grep -Eq '^(include/|lib/cmake|.*\.hpp,)' <<<"$record" || fail "the wheel ships C++ headers or a CMake package"
echo "ok: the wheel has the CLI script and no C++ development files ($(wc -l <<<"$record") files)"

runpath=$(readelf -d "$work/env/bin/strideattn" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')
extra=$(tr ':' '\n' <<<"$runpath" | grep -v '^\$ORIGIN/' || true)
if [[ $expect_cuda == OFF && -n $extra ]] || [[ -z $runpath ]]; then
  fail "the CLI's RUNPATH '$runpath' is not relative to itself"
fi
echo "ok: the CLI's RUNPATH $runpath"

(cd / && env -u PYTHONPATH "$py" "$src/tests/packaging/user_install_check.py" "$expect_cuda") ||
  fail "user_install_check.py"
