"""`python -m strideattn`: the strideattn CLI (tools/strideattn: demo, check, explain, bench,
fuzz, help, --version), which `pip install .` installs as a script beside the package, plus
three commands of the Python package itself: `info` (what this build contains: each backend
built or not and why, build_info()), `version` and `backends`. Any other command goes to the
CLI executable. A package installed without the CLI (see `info`) runs a subset here: `demo`
(the default), `version`, `backends`, `info`, `help`. Exit codes as the CLI's: 0 ok, 1 a
backend disagrees, 2 bad usage."""

from __future__ import annotations

import json
import os
import sys
from typing import List, Optional

from ._build_info import build_info, cli_path, format_info

PYTHON_COMMANDS = """  info      what this build contains: each backend built or not (and the configure step's
            reason when not), the CLI; --json for build_info() as JSON
  version   the library version
  backends  the backends this build has and can load now"""

USAGE = f"""usage: python -m strideattn [COMMAND ...]

With the strideattn CLI installed (pip install . puts it beside the package), every command
but the three below runs it: `python -m strideattn help` shows its usage.
{PYTHON_COMMANDS}

Without the CLI, these run here:
  demo      the seed case (q, k, v split from one fused [s, b, h + 2*hg, d] fp16 buffer,
            h=16, hg=1, d=64, causal) on every backend this build runs on the CPU, each
            compared with the reference backend (default command)
  help      this text"""


def _demo() -> int:
    import numpy as np

    import strideattn as sa

    s, b, h, hg, d = 128, 2, 16, 1, 64
    qkv = np.random.default_rng(0).standard_normal((s, b, h + 2 * hg, d)).astype(np.float16)
    q, k, v = (
        x.transpose(1, 0, 2, 3) for x in (qkv[:, :, :h], qkv[:, :, h : h + hg], qkv[:, :, h + hg :])
    )
    ex = sa.explain(q, k, v, mask="causal")
    print(
        f"seed case: [s={s}, b={b}, h={h}, hg={hg}, d={d}] fp16 views of one fused buffer, "
        f"causal\nlayout: {ex['layout']}"
    )
    ref = sa.attention(q, k, v, mask="causal", backend="reference").astype(np.float64)
    # agreement: two fp16 ulps at the largest output plus 1e-3 (the outputs are rounded to
    # fp16 after different fp32 summation orders)
    tol = 2 * float(np.spacing(np.float16(np.abs(ref).max()))) + 1e-3
    status = 0
    for verdict in ex["verdicts"]:
        name = verdict["backend"]
        if not verdict["supported"]:
            print(f"  {name:10s} skipped: {verdict['reason']}")
            continue
        o = sa.attention(q, k, v, mask="causal", backend=name).astype(np.float64)
        err = float(np.abs(o - ref).max())
        ok = err <= tol and not np.isnan(o).any()
        status = status if ok else 1
        print(f"  {name:10s} max |o - reference| = {err:.3e}  {'ok' if ok else 'DISAGREES'}")
    print(f"auto chooses: {ex['chosen']}")
    return status


def _usage_error(message: str) -> int:
    print(f"strideattn: {message}\n{USAGE}", file=sys.stderr)
    return 2


def _exec_cli(cli, args: List[str]) -> int:
    # The process becomes the CLI (its exit code, signals and terminal). The package directory
    # goes first on the library path too, for install layouts the CLI's RPATH does not cover.
    env = dict(os.environ)
    pkg = os.path.dirname(os.path.abspath(__file__))
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (pkg, env.get("LD_LIBRARY_PATH")) if p)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(str(cli), [str(cli), *args], env)
    return 2  # not reached


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    command = args[0] if args else None
    if command == "info":
        if args[1:] not in ([], ["--json"]):
            return _usage_error(f"'info' takes only --json (got {' '.join(args[1:])})")
        print(json.dumps(build_info(), indent=2) if args[1:] else format_info())
        return 0
    if command in ("version", "backends"):
        if len(args) > 1:
            return _usage_error(f"'{command}' takes no arguments (got {' '.join(args[1:])})")
        import strideattn as sa

        print(
            f"strideattn {sa.__version__}"
            if command == "version"
            else " ".join(sa.compiled_backends())
        )
        return 0
    cli = cli_path()
    if cli is not None:
        return _exec_cli(cli, args)
    # No CLI in this install: the subset above, and why the CLI is missing.
    command = command or "demo"
    if command in ("help", "-h", "--help"):
        print(USAGE)
        return 0
    if command == "demo" and len(args) <= 1:
        return _demo()
    reason = build_info()["cli"]["reason"] or "not found where pip installs scripts"
    return _usage_error(
        f"'{' '.join(args)}' needs the strideattn CLI, which this install does not have "
        f"({reason}); without it: demo, info, version, backends, help"
    )


if __name__ == "__main__":
    sys.exit(main())
