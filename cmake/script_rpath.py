"""Prints the RPATH entries that let an executable in a wheel's scripts directory find the
libraries in its package directory (platlib/PACKAGE), one per line: "$ORIGIN/<path from the
scripts directory to the package>" for each install scheme pip may use with this interpreter
(its default one, a venv, --user, --prefix) and "$ORIGIN/../PACKAGE" for `pip install
--target DIR` (DIR/bin beside DIR/PACKAGE), so the entries hold no path of the build machine.
Usage: python script_rpath.py PACKAGE. Used by python/CMakeLists.txt."""

import os
import sys
import sysconfig


def _default_scheme():
    get = getattr(sysconfig, "get_default_scheme", None)  # Python >= 3.10
    return get() if get else sysconfig._get_default_scheme()


def main(package):
    schemes = [_default_scheme(), "venv", "posix_prefix", "posix_user", "posix_local"]
    seen = []
    for scheme in schemes:
        if scheme not in sysconfig.get_scheme_names():
            continue
        paths = sysconfig.get_paths(scheme)
        rel = os.path.relpath(os.path.join(paths["platlib"], package), paths["scripts"])
        entry = "$ORIGIN/" + rel.replace(os.sep, "/")
        if entry not in seen:
            seen.append(entry)
    seen.append("$ORIGIN/../" + package)
    print("\n".join(seen))


if __name__ == "__main__":
    main(sys.argv[1])
