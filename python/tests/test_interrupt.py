"""Ctrl-C during a long host-backend call: the extension runs the call on a helper thread and
checks for signals while it waits, so SIGINT raises KeyboardInterrupt within a few seconds
(the call is cancelled through its cancel flag) instead of being ignored until the call ends
(2^40 stride-0 keys: hours of work)."""

import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

import strideattn as sa

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGINT via os.kill")


def huge_problem(n_keys):
    d = 8
    q = np.full((1, 4, 1, d), 0.5, np.float32)
    row = np.full((d,), 0.25, np.float32)
    k = np.lib.stride_tricks.as_strided(row, (1, n_keys, 1, d), (0, 0, 0, row.itemsize))
    return q, k


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_sigint_interrupts_a_long_call(backend):
    # cpu: 2^40 keys (3.5e13 FLOP). reference: 2^22 keys, many rows via a stride-0 Q.
    if backend == "cpu":
        q, k = huge_problem(1 << 40)
    else:
        q1, k = huge_problem(1 << 14)
        q = np.lib.stride_tricks.as_strided(q1, (1, 1 << 20, 1, 8), (0, 0, 0, q1.itemsize))
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            sa.attention(q, k, k, backend=backend)
    finally:
        timer.cancel()
    elapsed = time.monotonic() - start
    assert elapsed < 5.0, f"KeyboardInterrupt took {elapsed:.1f} s"
    # The library is usable afterwards (the cancelled call's thread has finished).
    small_q = np.ones((1, 3, 1, 8), np.float32)
    o = sa.attention(small_q, small_q, small_q, backend=backend)
    np.testing.assert_allclose(o, small_q, rtol=1e-6)


def test_sigint_interrupts_a_long_plan_run():
    """A plan's run (what the PyTorch eager path calls on a cached problem) waits the same
    way: SIGINT cancels it."""
    from strideattn import _ext

    q, k = huge_problem(1 << 40)
    out = np.empty_like(q)
    code, msg, plan = _ext.make_forward_plan(q, k, k, out, None, backend="cpu")
    assert code == "ok", msg
    addr = lambda a: a.__array_interface__["data"][0]  # noqa: E731
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            plan.run_forward(addr(q), addr(k), addr(k), addr(out))
    finally:
        timer.cancel()
    elapsed = time.monotonic() - start
    assert elapsed < 5.0, f"KeyboardInterrupt took {elapsed:.1f} s"
