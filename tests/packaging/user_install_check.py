"""What a user has after `pip install .` into a fresh virtual environment (run with that
environment's python by user_install.sh): the package imports and computes attention on
strided numpy views that agree with an independent numpy softmax, build_info() says what
was built (CPU-only here, on purpose: no warning), the CLI is installed beside the
interpreter and `python -m strideattn` runs it, and the typing files are in the package.
Usage: python user_install_check.py EXPECT_CUDA(ON|OFF)"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np

import strideattn as sa

expect_cuda = sys.argv[1] == "ON"
env_bin = pathlib.Path(sys.executable).parent
pkg = pathlib.Path(sa.__file__).parent
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise SystemExit(f"FAIL: {what}")
    checks += 1
    print(f"ok: {what}")


# --- the package comes from the fresh environment, not the source tree or another venv
check(pkg.is_relative_to(env_bin.parent), f"strideattn imported from the environment: {pkg}")


# --- attention on strided views against an fp64 numpy softmax written here
def softmax_attention(q, k, v, causal):
    # q [b, s_q, h, d]; k, v [b, s_kv, hg, d]; GQA: query head i reads kv head i // (h / hg)
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    rep = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
s_len, b, h, hg, d = 53, 2, 4, 2, 32
qkv = rng.standard_normal((s_len, b, h + 2 * hg, d)).astype(np.float32)  # fused sb(h+2hg)d
q, k, v = (
    x.transpose(1, 0, 2, 3) for x in (qkv[:, :, :h], qkv[:, :, h : h + hg], qkv[:, :, h + hg :])
)
check(not q.flags.c_contiguous, f"q is a strided view (strides {q.strides})")
ref = softmax_attention(q, k, v, causal=True)
for backend in ("reference", "cpu"):
    o = sa.attention(q, k, v, mask="causal", backend=backend)
    err = float(np.abs(o.astype(np.float64) - ref).max())
    check(o.shape == (b, s_len, h, d) and err < 1e-5, f"{backend}: max |o - numpy| = {err:.2e}")
# the comparison can fail: the same output against the unmasked softmax is far off
wrong = float(
    np.abs(
        sa.attention(q, k, v, mask="causal").astype(np.float64)
        - softmax_attention(q, k, v, causal=False)
    ).max()
)
check(wrong > 1e-2, f"a wrong reference is caught (max difference {wrong:.2e})")

# --- build_info(): what was built, and why not
info = sa.build_info()
backends = info["backends"]
check(info["version"] == sa.__version__, f"build_info version {info['version']}")
check(
    all(backends[n]["built"] and backends[n]["available"] for n in ("reference", "cpu")),
    "reference and cpu built and available",
)
check(backends["cuda"]["built"] == expect_cuda, f"cuda built: {backends['cuda']}")
if not expect_cuda:
    check(
        backends["cuda"]["reason"] == "configured with STRIDEATTN_CUDA=OFF"
        and not backends["cuda"]["requested"],
        f"cuda's reason: {backends['cuda']['reason']}",
    )
check(
    set(sa.compiled_backends()) == {n for n, e in backends.items() if e["available"]},
    f"build_info agrees with compiled_backends() {sa.compiled_backends()}",
)
cli = info["cli"]
check(
    cli["built"] and cli["path"] == str((env_bin / "strideattn").resolve()),
    f"build_info's CLI is the environment's script: {cli['path']}",
)

# --- python -m strideattn info, and no warning at import (GPU backends off on purpose)
r = subprocess.run([sys.executable, "-m", "strideattn", "info"], capture_output=True, text=True)
want = (
    "cuda       not built: configured with STRIDEATTN_CUDA=OFF"
    if not expect_cuda
    else "cuda       built"
)
check(
    r.returncode == 0 and want in r.stdout and not r.stderr,
    f"`python -m strideattn info`:\n{r.stdout}",
)
r = subprocess.run(
    [sys.executable, "-m", "strideattn", "info", "--json"], capture_output=True, text=True
)
check(r.returncode == 0 and json.loads(r.stdout)["backends"]["cpu"]["built"], "info --json parses")
r = subprocess.run([sys.executable, "-c", "import strideattn"], capture_output=True, text=True)
check(r.returncode == 0 and r.stderr == "", f"importing says nothing: {r.stderr!r}")

# --- the CLI, from the environment's bin/ and through python -m strideattn, elsewhere
clean = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}
exe = str(env_bin / "strideattn")
r = subprocess.run([exe, "--version"], capture_output=True, text=True, env=clean, cwd="/")
check(
    r.returncode == 0 and r.stdout.strip() == f"strideattn {sa.__version__}",
    f"strideattn --version: {r.stdout.strip()}",
)
for cmd in ([exe], [sys.executable, "-m", "strideattn"]):
    r = subprocess.run(
        [*cmd, "check", "--preset", "small", "--backends", "reference,cpu", "--grad"],
        capture_output=True,
        text=True,
        env=clean,
        cwd="/",
    )
    check(
        r.returncode == 0 and "every compared backend agrees" in r.stdout,
        f"{' '.join(cmd[-3:])} check --preset small --grad: exit {r.returncode}",
    )
r = subprocess.run(
    [exe, "check", "--preset", "small", "--seqlen-q", "0x"],
    capture_output=True,
    text=True,
    env=clean,
)
check(r.returncode == 2 and r.stderr.strip(), f"the CLI refuses bad input: {r.stderr.strip()}")

# --- typing
check(
    (pkg / "py.typed").is_file() and (pkg / "_ext.pyi").is_file(), "py.typed and _ext.pyi installed"
)

print(f"{checks} passed, 0 failed")
