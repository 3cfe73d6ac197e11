#!/usr/bin/env python3
"""Generates bench/sa_abi.py, the ctypes description of the strideattn C ABI, from
include/strideattn/strideattn.h, so that Python callers of libstrideattn_c.so never declare
the structs by hand. The header's enums become integer constants, its typedef structs
ctypes.Structure classes with the same fields in the same order, and its SA_API functions a
table of restype / argtypes that `load()` applies.

  python3 bench/gen_abi.py            rewrite bench/sa_abi.py
  python3 bench/gen_abi.py --check    exit 1 if bench/sa_abi.py differs from the header's

The parser knows the subset of C the header uses (fixed-width integers, size_t, double,
pointers, arrays of constant size, comma-separated declarators, opaque handles such as
`typedef struct sa_plan sa_plan;`, passed as addresses) and fails with the line it cannot
read rather than guessing.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(REPO, "include", "strideattn", "strideattn.h")
MODULE = os.path.join(REPO, "bench", "sa_abi.py")

SCALARS = {
    "int32_t": "ctypes.c_int32",
    "int64_t": "ctypes.c_int64",
    "uint64_t": "ctypes.c_uint64",
    "size_t": "ctypes.c_size_t",
    "double": "ctypes.c_double",
    "float": "ctypes.c_float",
    "int": "ctypes.c_int",
    "char": "ctypes.c_char",
}


class ParseError(Exception):
    pass


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def parse_enums(text: str) -> list[tuple[str, list[tuple[str, int]]]]:
    enums = []
    for m in re.finditer(r"\benum\s+(\w+)\s*\{([^}]*)\}\s*;", text):
        values, nxt = [], 0
        for item in (i.strip() for i in m.group(2).split(",")):
            if not item:
                continue
            em = re.fullmatch(r"(\w+)\s*(?:=\s*(-?\d+))?", item)
            if not em:
                raise ParseError(f"enum {m.group(1)}: cannot read {item!r}")
            nxt = int(em.group(2)) if em.group(2) is not None else nxt
            values.append((em.group(1), nxt))
            nxt += 1
        enums.append((m.group(1), values))
    return enums


def ctype_of(base: str, pointer: bool, structs: set[str]) -> str:
    if pointer:
        return "ctypes.c_void_p"  # data pointers: the caller passes an address
    if base in SCALARS:
        return SCALARS[base]
    if base in structs:
        return base
    raise ParseError(f"unknown type {base!r}")


def parse_structs(text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    structs: list[tuple[str, list[tuple[str, str]]]] = []
    known: set[str] = set()
    for m in re.finditer(r"typedef\s+struct\s+(\w+)\s*\{([^}]*)\}\s*(\w+)\s*;", text):
        tag, body, name = m.groups()
        if tag != name:
            raise ParseError(f"struct {tag} is typedef'd as {name}")
        fields = []
        for decl in (d.strip() for d in body.split(";")):
            if not decl:
                continue
            dm = re.fullmatch(r"(?:const\s+)?(\w+)\s*(\*?)\s*(.+)", decl, flags=re.S)
            if not dm:
                raise ParseError(f"struct {name}: cannot read {decl!r}")
            base, star, rest = dm.groups()
            for declarator in (x.strip() for x in rest.split(",")):
                xm = re.fullmatch(r"(\*?)\s*(\w+)\s*(?:\[(\d+)\])?", declarator)
                if not xm:
                    raise ParseError(f"struct {name}: cannot read declarator {declarator!r}")
                ctype = ctype_of(base, bool(star or xm.group(1)), known)
                if xm.group(3):
                    ctype = f"{ctype} * {int(xm.group(3))}"
                fields.append((xm.group(2), ctype))
        structs.append((name, fields))
        known.add(name)
    return structs


def parse_opaque(text: str) -> set[str]:
    """Opaque handles: `typedef struct X X;` (no body). A pointer to one is an address."""
    opaque = set()
    for m in re.finditer(r"typedef\s+struct\s+(\w+)\s+(\w+)\s*;", text):
        if m.group(1) != m.group(2):
            raise ParseError(f"struct {m.group(1)} is typedef'd as {m.group(2)}")
        opaque.add(m.group(1))
    return opaque


def param_type(decl: str, structs: set[str], opaque: frozenset = frozenset()) -> str:
    decl = re.sub(r"\bconst\b", "", decl).strip()
    m = re.fullmatch(r"(\w+)\s*(\*{0,2})\s*\w*", decl)
    if not m:
        raise ParseError(f"cannot read parameter {decl!r}")
    base, star = m.groups()
    if base in opaque and star:
        return "ctypes.POINTER(ctypes.c_void_p)" if star == "**" else "ctypes.c_void_p"
    if star == "**":
        raise ParseError(f"unknown pointer-to-pointer type {decl!r}")
    if star:
        if base == "char":
            return "ctypes.c_char_p"
        if base == "void":
            return "ctypes.c_void_p"
        if base in structs:
            return f"ctypes.POINTER({base})"
        if base in SCALARS:
            return f"ctypes.POINTER({SCALARS[base]})"
        raise ParseError(f"unknown pointer type {decl!r}")
    if base == "void":
        return "None"
    return ctype_of(base, False, structs)


def parse_functions(
    text: str, structs: set[str], opaque: frozenset = frozenset()
) -> list[tuple[str, str, list[str]]]:
    fns = []
    for m in re.finditer(r"\bSA_API\s+([^;(]+?)\s*\b(sa_\w+)\s*\(([^)]*)\)\s*;", text):
        ret, name, params = m.groups()
        args = (
            []
            if params.strip() in ("", "void")
            else [param_type(p, structs, opaque) for p in params.split(",")]
        )
        fns.append((name, param_type(ret, structs, opaque), args))
    return fns


def generate(header_text: str) -> str:
    text = strip_comments(header_text)
    enums = parse_enums(text)
    structs = parse_structs(text)
    fns = parse_functions(text, {s for s, _ in structs}, frozenset(parse_opaque(text)))
    if not enums or not structs or not fns:
        raise ParseError("found no enums, structs or functions: is this strideattn.h?")
    out = [
        "# Generated by bench/gen_abi.py from include/strideattn/strideattn.h; do not edit.",
        "# Regenerate with `python3 bench/gen_abi.py` after changing the header.",
        '"""ctypes description of the strideattn C ABI (libstrideattn_c.so): the header\'s enums',
        "as constants, its structs as ctypes.Structure classes, and load(path), which opens the",
        'library and sets every function\'s restype and argtypes."""',
        "import ctypes",
        "",
    ]
    for name, values in enums:
        out.append(f"# enum {name}")
        out += [f"{k} = {v}" for k, v in values]
        out.append("")
    for name, fields in structs:
        out.append("")
        out.append(f"class {name}(ctypes.Structure):")
        out.append("    _fields_ = [")
        out += [f'        ("{f}", {t}),' for f, t in fields]
        out.append("    ]")
        out.append("")
    out.append("")
    out.append("FUNCTIONS = {")
    for name, ret, args in fns:
        out.append(f'    "{name}": ({ret}, [{", ".join(args)}]),')
    out.append("}")
    out += [
        "",
        "",
        "def load(path):",
        '    """Opens libstrideattn_c.so at `path` with every sa_* function typed."""',
        "    lib = ctypes.CDLL(path)",
        "    for name, (restype, argtypes) in FUNCTIONS.items():",
        "        fn = getattr(lib, name)",
        "        fn.restype = restype",
        "        fn.argtypes = argtypes",
        "    return lib",
        "",
    ]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="compare bench/sa_abi.py with the header instead of writing it",
    )
    ap.add_argument("--header", default=HEADER)
    ap.add_argument("--module", default=MODULE)
    args = ap.parse_args()
    with open(args.header) as f:
        text = generate(f.read())
    if args.check:
        try:
            with open(args.module) as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current != text:
            print(
                f"gen_abi: {args.module} is out of date with {args.header}; "
                "run python3 bench/gen_abi.py",
                file=sys.stderr,
            )
            return 1
        return 0
    with open(args.module, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
