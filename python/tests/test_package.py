"""Tests of the package itself, not of attention numbers: module structure (no import cycle
between _core and torch.py), the license and metadata of the installed distribution, one
version everywhere, the extension's type stubs. (build_info() and `python -m strideattn`:
test_build_info.py.)"""

import ast
import importlib.metadata
import pathlib
import re
import subprocess
import sys

import pytest

import strideattn as sa

PKG = pathlib.Path(sa.__file__).parent  # the installed package
SRC = pathlib.Path(__file__).parents[2]  # the repository root


def _imports(path):
    """Every module name a file imports (relative ones as '.name'), anywhere in the file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names.add(base)
            names.update(
                f"{base}.{a.name}" if node.module else f"{base}{a.name}" for a in node.names
            )
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            names.update(a.value for a in node.args if isinstance(a, ast.Constant))
    return names


def test_core_never_imports_the_torch_layer():
    # _core.py imported torch.py (for the autograd redirect) and torch.py imported _core.py.
    names = _imports(SRC / "python/strideattn/_core.py")
    assert not {n for n in names if n in (".torch", "strideattn.torch") or n.endswith(".torch")}, (
        names
    )


def test_torch_layer_uses_no_private_core_helpers():
    # torch.py called _core._dim_order, _core._raise_for, ...: shared helpers live in _util.
    for name in ("torch.py", "_torch_ops.py", "_torch_module.py", "_dropin.py"):
        text = (SRC / "python/strideattn" / name).read_text()
        assert not re.findall(r"_core\._\w+", text), name


def test_core_import_alone_does_not_load_the_torch_layer():
    code = (
        "import sys, strideattn._core; "
        "assert 'strideattn.torch' not in sys.modules and 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------- metadata, version


def _project_version():
    text = (SRC / "CMakeLists.txt").read_text()
    return re.search(r"project\(strideattn\s+VERSION\s+([0-9.]+)", text).group(1)


def test_one_version_everywhere():
    want = _project_version()
    assert sa.__version__ == want == sa.version()
    assert importlib.metadata.version("strideattn") == want
    # and nowhere else: pyproject.toml reads it (dynamic), the C++ library is compiled with it
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    project = tomllib.loads((SRC / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert not re.search(r'"[0-9]+\.[0-9]+\.[0-9]+"', (SRC / "src/api.cpp").read_text())


def test_license_and_metadata_of_the_installed_distribution():
    dist = importlib.metadata.distribution("strideattn")
    meta = dist.metadata
    assert meta["License"] == "Apache-2.0"
    classifiers = meta.get_all("Classifier")
    assert "License :: OSI Approved :: Apache Software License" in classifiers
    assert "Typing :: Typed" in classifiers
    assert meta["Keywords"] and "attention" in meta["Keywords"]
    assert {"torch", "jax", "test"} <= set(meta.get_all("Provides-Extra"))
    licenses = [f for f in dist.files if f.name == "LICENSE"]
    assert licenses, "LICENSE is not in the wheel"
    text = licenses[0].locate().read_text()
    assert text == (SRC / "LICENSE").read_text()


def test_license_file_is_apache_2():
    text = (SRC / "LICENSE").read_text()
    assert text.startswith("Copyright the strideattn authors\n")
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply" in text
    assert len(text) > 11000  # the full text, not a pointer to it


# ----------------------------------------------------------------------------- typing


def test_py_typed_and_stubs_are_installed():
    assert (PKG / "py.typed").exists()
    assert (PKG / "_ext.pyi").exists()


def _strip_header(text):
    return "\n".join(line for line in text.splitlines() if not line.startswith("#")).strip()


def test_extension_stubs_are_current(tmp_path):
    # the checked-in _ext.pyi against what nanobind's stubgen writes for the built extension
    nanobind = pytest.importorskip("nanobind", reason="nanobind is not installed")
    pytest.importorskip("nanobind.stubgen", reason="nanobind is not installed")
    checked_in = (SRC / "python/strideattn/_ext.pyi").read_text()
    # stubgen's output differs between nanobind versions: compare only with the one that
    # wrote the checked-in file (its header names it; the pinned build requirement)
    made_by = re.search(r"nanobind[\s#(]*([0-9][0-9.]*[0-9])", checked_in)
    if made_by is None or made_by.group(1) != nanobind.__version__:
        pytest.skip(
            f"nanobind {nanobind.__version__} here; the stubs were made by {made_by and made_by.group(1)}"
        )
    out = tmp_path / "_ext.pyi"
    subprocess.run(
        [sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "strideattn._ext", "-o", str(out)],
        check=True,
    )
    assert _strip_header(out.read_text()) == _strip_header(checked_in), (
        "python/strideattn/_ext.pyi is stale: regenerate it with the command in its header"
    )


def test_public_functions_have_type_hints():
    import inspect

    for name in (
        "attention",
        "attention_backward",
        "explain",
        "sdpa",
        "flash_attn_func",
        "flash_attn_varlen_func",
        "version",
        "compiled_backends",
        "build_info",
    ):
        sig = inspect.signature(getattr(sa, name))
        assert sig.return_annotation is not inspect.Signature.empty, name
        for p in sig.parameters.values():
            assert p.annotation is not inspect.Parameter.empty, f"{name}({p.name})"
