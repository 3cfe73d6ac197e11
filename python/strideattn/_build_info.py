"""What this build of strideattn contains, as its configure step recorded it
(build_config.json, written by cmake/StrideattnBuildInfo.cmake): build_info(), the text
`python -m strideattn info` prints, and the check, run once at import, that warns through the
library's log when a GPU is visible but a GPU backend that was asked for is not in the build
(pip hides the configure summary that says so unless run with -v)."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import logging
import os
import pathlib
from typing import Any, Dict, Optional

from . import _log

_CONFIG = pathlib.Path(__file__).with_name("build_config.json")
GPU_BACKENDS = ("cuda", "cudnn")
_cache: Optional[Dict[str, Any]] = None
_warned = False


def _recorded() -> Dict[str, Any]:
    # build_config.json as written at configure time (read once; loads no GPU module)
    global _cache
    if _cache is None:
        try:
            _cache = json.loads(_CONFIG.read_text())
        except FileNotFoundError:
            raise RuntimeError(
                f"{_CONFIG} is missing: this strideattn was not installed by its build "
                "(pip install .), so what it contains was not recorded"
            ) from None
    return _cache


def cli_path() -> Optional[pathlib.Path]:
    """The strideattn CLI executable installed with this package (the wheel's scripts, found
    through the installed distribution's file list and checked against its recorded size),
    or None when there is none."""
    try:
        dist = importlib.metadata.distribution("strideattn")
    except importlib.metadata.PackageNotFoundError:
        return None
    # the distribution found must be the one this package was installed from
    here = pathlib.Path(__file__).resolve().parent
    if pathlib.Path(str(dist.locate_file("strideattn"))).resolve() != here:
        return None
    for f in dist.files or ():
        if f.name != "strideattn" or len(f.parts) < 2 or f.parts[-2] not in ("bin", "Scripts"):
            continue
        # where the record says; `pip install --target DIR` puts it in DIR/bin instead
        for path in (pathlib.Path(str(dist.locate_file(f))), here.parent / f.parts[-2] / f.name):
            if (
                path.is_file()
                and os.access(path, os.X_OK)
                and (f.size is None or path.stat().st_size == f.size)
            ):
                return path.resolve()
    return None


def build_info() -> Dict[str, Any]:
    """What this build contains, as recorded at configure time:

    - "version": the library version;
    - "backends": {name: {"built", "requested", "reason", "detail", "available"}} for
      reference, cpu, cuda and cudnn: "built" whether it was compiled, "requested" whether
      the configure was asked for it (STRIDEATTN_CUDA / STRIDEATTN_CUDNN, on by default),
      "reason" why not when it was not built (the configure summary's words), "detail" what
      was built (toolkit, architectures, cuDNN library), "available" whether it can be called
      now (compiled_backends(): a GPU backend whose module cannot load is built but not
      available, and explain() says why);
    - "cli": {"built", "reason", "path"}: the strideattn CLI installed with the package;
    - "compiler", "build_type".

    Returns a new dict on each call."""
    info = copy.deepcopy(_recorded())
    from . import _core

    available = set(_core.compiled_backends())
    for name, entry in info["backends"].items():
        entry["available"] = name in available
    cli = cli_path() if info["cli"]["built"] else None
    info["cli"]["path"] = str(cli) if cli else None
    return info


def format_info(info: Optional[Dict[str, Any]] = None) -> str:
    """build_info() as the lines `python -m strideattn info` prints."""
    info = build_info() if info is None else info
    lines = [f"strideattn {info['version']} ({info['build_type']}, {info['compiler']})"]
    for name, b in info["backends"].items():
        if b["built"]:
            state = "built" if b["available"] else "built, NOT AVAILABLE (explain() says why)"
            lines.append(f"  {name:10s} {state}" + (f": {b['detail']}" if b["detail"] else ""))
        else:
            lines.append(f"  {name:10s} not built: {b['reason']}")
    cli = info["cli"]
    if cli["built"]:
        lines.append(
            f"  {'cli':10s} {cli['path'] or 'built, but not found where pip installs scripts'}"
        )
    else:
        lines.append(f"  {'cli':10s} not built: {cli['reason']}")
    warning = missing_gpu_backends_message(info, gpu_visible())
    if warning:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)


def gpu_visible() -> bool:
    """Whether this process can see an NVIDIA GPU, without loading any CUDA library: the
    driver lists one (/proc/driver/nvidia/gpus, or a /dev/nvidiaN device) and
    CUDA_VISIBLE_DEVICES does not hide them all."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and (hidden.strip() == "" or hidden.strip().startswith("-")):
        return False
    try:
        if any(os.scandir("/proc/driver/nvidia/gpus")):
            return True
    except OSError:
        pass
    try:
        return any(e.name[6:].isdigit() for e in os.scandir("/dev") if e.name.startswith("nvidia"))
    except OSError:
        return False


def missing_gpu_backends_message(info: Dict[str, Any], visible: bool) -> Optional[str]:
    """The warning for a machine with a GPU whose build lacks a GPU backend it was asked for
    (one switched off on purpose, e.g. STRIDEATTN_CUDA=OFF, is not warned about); None when
    there is nothing to say."""
    if not visible:
        return None
    backends = info["backends"]
    missing = [n for n in GPU_BACKENDS if backends[n]["requested"] and not backends[n]["built"]]
    if not missing:
        return None
    if "cuda" in missing:
        what = f"no 'cuda' backend ({backends['cuda']['reason']}), so GPU tensors are refused"
    else:
        what = f"no '{missing[0]}' backend ({backends[missing[0]]['reason']})"
    return (
        f"a GPU is visible but this strideattn build has {what}. Rebuild where the configure "
        "finds what is missing (`pip install -v .` shows its summary); `python -m strideattn "
        "info` shows what this build has; STRIDEATTN_LOG=off silences this warning."
    )


def _silenced() -> bool:
    # STRIDEATTN_LOG set to an "off" value, or Python logging configured to drop warnings.
    if "STRIDEATTN_LOG" in os.environ and _log.get_log_level() == "off":
        return True
    return not _log.logger.isEnabledFor(logging.WARNING)


def warn_if_gpu_backends_missing() -> Optional[str]:
    """Logs missing_gpu_backends_message() once per process at warning level, through the
    library's log (the "strideattn" logger, or stderr while no logging handler is configured),
    unless silenced; returns what it logged. Called when strideattn is imported."""
    global _warned
    if _warned:
        return None
    _warned = True
    try:
        info = _recorded()
    except RuntimeError:
        return None  # not an installed build: nothing recorded to compare with
    message = missing_gpu_backends_message(info, gpu_visible())
    if message is None or _silenced():
        return None
    _log._forward(2, message)
    return message
