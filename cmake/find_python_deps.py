"""Prints where a Python environment keeps strideattn's GPU build dependencies, one
`key=value` line each (nothing for what it lacks): the cuDNN frontend headers (PyPI
nvidia-cudnn-frontend), cuDNN (PyPI nvidia-cudnn-cu13: nvidia/cudnn) and the environment's
platlib (where the strideattn package will be installed). Imports none of the packages.
Used by cmake/StrideattnGpuDeps.cmake."""

import importlib.metadata as md
import importlib.util
import os
import sysconfig


def frontend_include():
    try:
        dist = md.distribution("nvidia-cudnn-frontend")
    except md.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if str(f).replace("\\", "/") == "include/cudnn_frontend.h":
            return os.path.dirname(os.path.abspath(str(dist.locate_file(f))))
    return None


def cudnn_root():
    try:
        spec = importlib.util.find_spec("nvidia.cudnn")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        if os.path.isfile(os.path.join(root, "include", "cudnn.h")):
            return os.path.abspath(root)
    return None


for key, value in (
    ("frontend_include", frontend_include()),
    ("cudnn_root", cudnn_root()),
    ("platlib", sysconfig.get_paths()["platlib"]),
):
    if value:
        print(f"{key}={value}")
