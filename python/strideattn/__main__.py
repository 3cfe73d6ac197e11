"""`python -m strideattn`: the part of the CLI that the Python package can offer without the
C++ tool (which is not in the wheel): `demo` (the default), `version`, `backends`, `help`.
The full CLI (check, explain, bench, fuzz on any problem) is tools/strideattn, built with
-DSTRIDEATTN_TOOLS=ON. Exit codes as the CLI's: 0 ok, 1 a backend disagrees, 2 bad usage."""

from __future__ import annotations

import sys
from typing import List, Optional

USAGE = """usage: python -m strideattn [demo | version | backends | help]

  demo      the seed case (q, k, v split from one fused [s, b, h + 2*hg, d] fp16 buffer,
            h=16, hg=1, d=64, causal) on every backend this build runs on the CPU, each
            compared with the reference backend (default command)
  version   the library version
  backends  the backends compiled into this build
  help      this text

The full CLI (check, explain, bench, fuzz) is the C++ tool tools/strideattn
(configure with -DSTRIDEATTN_TOOLS=ON)."""


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


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "demo"
    if len(args) > 1:
        print(
            f"strideattn: '{command}' takes no arguments (got {' '.join(args[1:])})\n{USAGE}",
            file=sys.stderr,
        )
        return 2
    if command == "demo":
        return _demo()
    if command == "version":
        import strideattn as sa

        print(f"strideattn {sa.__version__}")
        return 0
    if command == "backends":
        import strideattn as sa

        print(" ".join(sa.compiled_backends()))
        return 0
    if command in ("help", "-h", "--help"):
        print(USAGE)
        return 0
    print(
        f"strideattn: unknown command '{command}' from Python; supported: demo, version, "
        f"backends, help\n{USAGE}",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
