"""What the installed build contains and how a user learns it: build_info() against the core's
own view (compiled_backends, explain), the warning when a GPU is visible but a GPU backend
that was asked for is missing (faked here: no GPU on the CPU machines), once per process and
through the library's log, and `python -m strideattn`: its own commands (info, version,
backends), the CLI it runs when the CLI is installed, the subset without it."""

import copy
import json
import logging
import re
import subprocess
import sys

import numpy as np
import pytest

import strideattn as sa
from strideattn import _build_info
from strideattn import __main__ as sa_main


def _info(cuda=(True, True, ""), cudnn=(True, True, "")):
    """A build_info()-shaped record: (built, requested, reason) for cuda and cudnn."""
    info = copy.deepcopy(_build_info._recorded())
    for name, (built, requested, reason) in (("cuda", cuda), ("cudnn", cudnn)):
        info["backends"][name].update(built=built, requested=requested, reason=reason)
    return info


NO_NVCC = "no CUDA compiler found at configure time (nvcc not on PATH, CUDACXX and CMAKE_CUDA_COMPILER unset)"
NO_FRONTEND = "cudnn_frontend.h not found: install nvidia-cudnn-frontend==1.32.0 ..."


# ----------------------------------------------------------------------------- build_info()


def test_build_info_matches_what_the_core_reports():
    info = sa.build_info()
    assert info["version"] == sa.__version__
    backends = info["backends"]
    assert list(backends) == ["reference", "cpu", "cuda", "cudnn"]
    assert {n for n, b in backends.items() if b["available"]} == set(sa.compiled_backends())
    for name, b in backends.items():
        assert set(b) == {"built", "requested", "reason", "detail", "available"}, name
        assert bool(b["reason"]) != b["built"], (name, b)  # a reason exactly when not built
        assert b["built"] or not b["available"], (name, b)
    assert backends["reference"]["built"] and backends["cpu"]["built"]
    # a GPU backend left out: explain() gives the same reason the configure step recorded
    x = np.zeros((1, 4, 1, 8), np.float32)
    verdicts = {v["backend"]: v["reason"] for v in sa.explain(x, x, x)["verdicts"]}
    if not backends["cuda"]["built"]:
        assert backends["cuda"]["reason"] in verdicts["cuda"], verdicts["cuda"]
    elif not backends["cudnn"]["built"]:
        assert backends["cudnn"]["reason"] in verdicts["cudnn"], verdicts["cudnn"]


def test_build_info_is_a_fresh_copy_and_json():
    a = sa.build_info()
    a["backends"]["cpu"]["built"] = False
    assert sa.build_info()["backends"]["cpu"]["built"]
    json.dumps(sa.build_info())


def test_build_info_without_a_record_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(_build_info, "_cache", None)
    monkeypatch.setattr(_build_info, "_CONFIG", tmp_path / "build_config.json")
    with pytest.raises(
        RuntimeError, match="build_config.json is missing: this strideattn was not installed"
    ):
        sa.build_info()


def test_format_info_says_built_missing_and_unavailable():
    info = _info(cuda=(True, True, ""), cudnn=(False, True, NO_FRONTEND))
    for name, b in info["backends"].items():
        b["available"] = name != "cuda"  # built but its module does not load
    info["cli"].update(built=False, reason="configured with STRIDEATTN_TOOLS=OFF", path=None)
    text = _build_info.format_info(info)
    assert re.search(r"^  cpu +built: ", text, re.M), text
    assert re.search(r"^  cuda +built, NOT AVAILABLE \(explain\(\) says why\)", text, re.M), text
    assert f"  cudnn      not built: {NO_FRONTEND}" in text
    assert "  cli        not built: configured with STRIDEATTN_TOOLS=OFF" in text


# ----------------------------------------------------------------------------- the GPU warning


def test_gpu_visible_reads_the_driver_and_cuda_visible_devices(monkeypatch):
    class Entry:
        def __init__(self, name):
            self.name = name

    def scandir(path):
        return iter({"/proc/driver/nvidia/gpus": [Entry("0000:3b:00.0")], "/dev": []}[path])

    monkeypatch.setattr(_build_info.os, "scandir", scandir)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _build_info.gpu_visible()
    for hidden in ("", "-1", " -1,0"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert not _build_info.gpu_visible(), hidden
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert _build_info.gpu_visible()

    def dev_only(path):  # no /proc entry, a /dev/nvidia0 device (not /dev/nvidiactl)
        if path.startswith("/proc"):
            raise FileNotFoundError(path)
        return iter([Entry("nvidiactl"), Entry("nvidia-uvm"), Entry("nvidia0")])

    monkeypatch.setattr(_build_info.os, "scandir", dev_only)
    assert _build_info.gpu_visible()
    monkeypatch.setattr(
        _build_info.os, "scandir", lambda p: iter([Entry("nvidiactl")]) if p == "/dev" else iter([])
    )
    assert not _build_info.gpu_visible()


def test_missing_gpu_backend_message_names_the_backend_and_the_reason():
    msg = _build_info.missing_gpu_backends_message
    no_cuda = _info(
        cuda=(False, True, NO_NVCC),
        cudnn=(False, True, f"no CUDA backends in this build ({NO_NVCC})"),
    )
    m = msg(no_cuda, True)
    assert m.startswith(
        "a GPU is visible but this strideattn build has no 'cuda' backend (no CUDA compiler"
    )
    assert (
        "GPU tensors are refused" in m
        and "python -m strideattn info" in m
        and "STRIDEATTN_LOG=off" in m
    )
    m = msg(_info(cudnn=(False, True, NO_FRONTEND)), True)
    assert f"has no 'cudnn' backend ({NO_FRONTEND})" in m and "refused" not in m
    # nothing to say: no GPU, everything built, or the GPU backends switched off on purpose
    assert msg(no_cuda, False) is None
    assert msg(_info(), True) is None
    off = "configured with STRIDEATTN_CUDA=OFF"
    assert msg(_info(cuda=(False, False, off), cudnn=(False, False, off)), True) is None
    assert msg(_info(cudnn=(False, False, "configured with STRIDEATTN_CUDNN=OFF")), True) is None


@pytest.fixture
def fake_gpu_machine(monkeypatch):
    """A visible GPU and a build whose configure found no nvcc; the once-flag reset."""
    info = _info(cuda=(False, True, NO_NVCC), cudnn=(False, True, "no CUDA backends in this build"))
    monkeypatch.setattr(_build_info, "_recorded", lambda: info)
    monkeypatch.setattr(_build_info, "gpu_visible", lambda: True)
    monkeypatch.setattr(_build_info, "_warned", False)
    monkeypatch.delenv("STRIDEATTN_LOG", raising=False)


def test_warning_reaches_the_strideattn_logger_once(fake_gpu_machine, caplog):
    with caplog.at_level(logging.DEBUG, logger="strideattn"):
        first = _build_info.warn_if_gpu_backends_missing()
        assert _build_info.warn_if_gpu_backends_missing() is None
    records = [r for r in caplog.records if r.name == "strideattn"]
    assert [r.levelno for r in records] == [logging.WARNING], records
    assert records[0].getMessage() == first and "no 'cuda' backend" in first


def test_warning_silenced_by_strideattn_log_off_or_python_logging(
    fake_gpu_machine, monkeypatch, caplog
):
    monkeypatch.setenv("STRIDEATTN_LOG", "off")
    assert _build_info.warn_if_gpu_backends_missing() is None
    monkeypatch.setattr(_build_info, "_warned", False)
    monkeypatch.delenv("STRIDEATTN_LOG")
    logger = logging.getLogger("strideattn")
    monkeypatch.setattr(logger, "level", logging.ERROR)
    with caplog.at_level(logging.ERROR, logger="strideattn"):
        assert _build_info.warn_if_gpu_backends_missing() is None
    assert not [r for r in caplog.records if r.name == "strideattn"]


IMPORT_ON_A_FAKE_GPU_MACHINE = """
import importlib.util, sys
spec = importlib.util.find_spec("strideattn")
pkg = importlib.util.module_from_spec(spec)
sys.modules["strideattn"] = pkg  # the package body has not run yet
import strideattn._build_info as bi
info = bi._recorded()
info["backends"]["cuda"].update(built=False, requested=True, reason={reason!r})
bi.gpu_visible = lambda: True
spec.loader.exec_module(pkg)  # `import strideattn`, on a machine whose GPU the build cannot use
import strideattn
strideattn.attention(*[__import__("numpy").ones((1, 3, 1, 8), "float32")] * 3)
print("imported")
"""


def test_import_warns_on_stderr_once_without_logging_configured():
    code = IMPORT_ON_A_FAKE_GPU_MACHINE.format(reason=NO_NVCC)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "imported\n", r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "[strideattn] warning: a GPU is visible but this strideattn build has no 'cuda' backend "
        "(no CUDA compiler found at configure time"
    ), r.stderr


def test_import_here_says_nothing():
    # this machine: no GPU visible, or a build that has what was asked for
    r = subprocess.run([sys.executable, "-c", "import strideattn"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == ""


# ----------------------------------------------------------------------------- python -m strideattn


def _run(*args):
    return subprocess.run(
        [sys.executable, "-m", "strideattn", *args], capture_output=True, text=True
    )


def test_main_info_version_backends():
    r = _run("info")
    assert r.returncode == 0 and r.stdout.strip() == _build_info.format_info()
    for name, b in sa.build_info()["backends"].items():
        assert re.search(
            rf"^  {name} +{'built' if b['built'] else 'not built: ' + re.escape(b['reason'])}",
            r.stdout,
            re.M,
        ), r.stdout
    r = _run("info", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == sa.build_info()
    r = _run("version")
    assert r.returncode == 0 and r.stdout.strip() == f"strideattn {sa.__version__}"
    r = _run("backends")
    assert r.returncode == 0 and set(r.stdout.split()) == set(sa.compiled_backends())
    for bad in (("info", "--yaml"), ("version", "--json")):
        r = _run(*bad)
        assert r.returncode == 2 and "takes" in r.stderr, (bad, r.stderr)


needs_cli = pytest.mark.skipif(
    _build_info.cli_path() is None, reason="this install has no strideattn CLI"
)


@needs_cli
def test_main_runs_the_installed_cli():
    cli = str(_build_info.cli_path())
    for args in (
        ("help",),
        ("--version",),
        ("fuzz",),
        ("check", "--preset", "small", "--backends", "cpu"),
    ):
        want = subprocess.run([cli, *args], capture_output=True, text=True)
        got = _run(*args)
        assert (got.returncode, got.stderr) == (want.returncode, want.stderr), args
        # the CLI's own report (its run times differ from run to run)
        first_last = lambda out: (out.splitlines()[:1], out.splitlines()[-1:])  # noqa: E731
        assert first_last(got.stdout) == first_last(want.stdout), (args, got.stdout)
    assert "strideattn check   PROBLEM" in _run("help").stdout
    assert _run("fuzz").returncode == 2


def test_main_without_the_cli_runs_the_subset(monkeypatch, capsys):
    monkeypatch.setattr(sa_main, "cli_path", lambda: None)
    assert sa_main.main([]) == 0
    out = capsys.readouterr().out
    assert "seed case" in out
    for backend in ("reference", "cpu"):
        assert re.search(rf"{backend}\s+max \|o - reference\| = \S+\s+ok", out), out
    assert sa_main.main(["help"]) == 0 and "usage: python -m strideattn" in capsys.readouterr().out
    assert sa_main.main(["check", "--preset", "small"]) == 2
    err = capsys.readouterr().err
    assert (
        "'check --preset small' needs the strideattn CLI, which this install does not have" in err
    )
