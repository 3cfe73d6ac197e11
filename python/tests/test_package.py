"""Tests of the package itself, not of attention numbers: module structure (no import cycle
between _core and torch.py), the license and metadata of the installed distribution, one
version everywhere, the extension's type stubs, and `python -m strideattn`."""

import ast
import importlib.metadata
import pathlib
import re
import subprocess
import sys

import pytest

import strideattn as sa

PKG = pathlib.Path(sa.__file__).parent          # the installed package
SRC = pathlib.Path(__file__).parents[2]          # the repository root


def _imports(path):
    """Every module name a file imports (relative ones as '.name'), anywhere in the file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names.add(base)
            names.update(f"{base}.{a.name}" if node.module else f"{base}{a.name}" for a in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            names.update(a.value for a in node.args if isinstance(a, ast.Constant))
    return names


def test_core_never_imports_the_torch_layer():
    # _core.py imported torch.py (for the autograd redirect) and torch.py imported _core.py.
    names = _imports(SRC / "python/strideattn/_core.py")
    assert not {n for n in names if n in (".torch", "strideattn.torch") or n.endswith(".torch")}, names


def test_torch_layer_uses_no_private_core_helpers():
    # torch.py called _core._dim_order, _core._raise_for, ...: shared helpers live in _util.
    for name in ("torch.py", "_torch_ops.py", "_torch_module.py", "_dropin.py"):
        text = (SRC / "python/strideattn" / name).read_text()
        assert not re.findall(r"_core\._\w+", text), name


def test_core_import_alone_does_not_load_the_torch_layer():
    code = ("import sys, strideattn._core; "
            "assert 'strideattn.torch' not in sys.modules and 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
