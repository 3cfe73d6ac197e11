"""The library's log through Python's logging: set_log_level names, aliases and logging
levels; records on the "strideattn" logger from calls made with the GIL released and from
several threads; repeated messages folded into counts with a final flush; nothing while off;
STRIDEATTN_LOG read at import, with a warning for an unknown value (stderr when no logging
handler is configured)."""

import logging
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import strideattn as sa


@pytest.fixture
def records(caplog):
    caplog.set_level(logging.DEBUG, logger="strideattn")
    sa.set_log_level("off")
    caplog.clear()
    yield lambda: [r for r in caplog.records if r.name == "strideattn"]
    sa.set_log_level("off")


def qkv(rng):
    return [rng.standard_normal((1, 6, 2, 8)).astype(np.float32) for _ in range(3)]


def test_level_names_aliases_and_logging_levels():
    try:
        for given, want in [
            ("INFO", "info"),
            ("Debug", "debug"),
            ("warning", "warn"),
            ("1", "info"),
            ("verbose", "debug"),
            (logging.DEBUG, "debug"),
            (logging.INFO, "info"),
            (logging.WARNING, "warn"),
            (logging.ERROR, "error"),
            (None, "off"),
        ]:
            sa.set_log_level(given)
            assert sa.get_log_level() == want, given
        with pytest.raises(
            ValueError,
            match="log level 'loud' is unknown; accepted .*off, error, warn, info, debug",
        ):
            sa.set_log_level("loud")
        with pytest.raises(TypeError):
            sa.set_log_level(True)
    finally:
        sa.set_log_level("off")


def test_repeated_calls_log_once_then_counts(records, rng):
    q, k, v = qkv(rng)
    sa.set_log_level("info")
    for _ in range(10):
        sa.attention(q, k, v, backend="cpu")
    sa.flush_log()
    msgs = [r.getMessage() for r in records()]
    assert msgs[0].startswith("forward runs on cpu"), msgs
    first = msgs[0]
    assert msgs == [first] + [
        f"... repeated {n} time{'s' * (n > 1)}: {first}" for n in (1, 2, 4, 8, 9)
    ]
    assert all(r.levelno == logging.INFO for r in records())


def test_threads_with_the_gil_released(records, rng):
    q, k, v = qkv(rng)
    sa.set_log_level("info")
    errors = []

    def work():
        try:
            for _ in range(5):
                sa.attention(q, k, v, backend="reference")
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    sa.flush_log()
    msgs = [r.getMessage() for r in records()]
    firsts = [m for m in msgs if m.startswith("forward runs on reference")]
    assert len(firsts) == 1, msgs
    assert msgs[-1] == f"... repeated 19 times: {firsts[0]}"


def test_nothing_while_off(records, rng):
    q, k, v = qkv(rng)
    for _ in range(3):
        sa.attention(q, k, v, backend="cpu")
    sa.flush_log()
    assert records() == []


def run_python(code, log_value):
    env = dict(os.environ, STRIDEATTN_LOG=log_value)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_environment_level_and_unknown_value_warning():
    p = run_python("import strideattn as sa; print(sa.get_log_level())", "INFO")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "info" and p.stderr == ""
    # no logging configuration: the library's own stderr line
    p = run_python("import strideattn as sa; print(sa.get_log_level())", "loud")
    assert p.stdout.strip() == "warn"
    assert (
        "[strideattn] warning: STRIDEATTN_LOG='loud' is not a log level; accepted (any case): "
        "off, error, warn, info, debug" in p.stderr
    )
    # configured logging: a WARNING record of the "strideattn" logger
    p = run_python(
        "import logging; logging.basicConfig(format='%(levelname)s|%(name)s|%(message)s')\n"
        "import strideattn",
        "Loud",
    )
    assert "WARNING|strideattn|STRIDEATTN_LOG='Loud' is not a log level" in p.stderr, p.stderr


def test_counts_pending_at_exit_are_logged(tmp_path):
    code = (
        "import numpy as np, strideattn as sa\n"
        "q = np.ones((1, 4, 1, 8), np.float32)\n"
        "for _ in range(4): sa.attention(q, q, q, backend='cpu')\n"
    )
    p = run_python(code, "info")
    assert p.returncode == 0, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines[0].startswith("[strideattn] forward runs on cpu"), p.stderr
    first = lines[0][len("[strideattn] ") :]
    assert lines[1:] == [
        f"[strideattn] ... repeated {n} time{'s' * (n > 1)}: {first}" for n in (1, 2, 3)
    ]
