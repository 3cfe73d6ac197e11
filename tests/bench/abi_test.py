#!/usr/bin/env python3
"""bench/sa_abi.py, the ctypes description of the C ABI, against include/strideattn/strideattn.h:
it is what bench/gen_abi.py generates from the header today; every struct's size and every
field's offset equal the C compiler's (SA_CXX: a compiler to build the probe with); and, with
SA_C_LIB set to libstrideattn_c.so, calls through it reach the library with the fields where
the library reads them (a reference-backend forward on host memory against a plain-Python
softmax, and a bad head-dim stride refused with its message). Runs without a GPU."""

import ctypes
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
import gen_abi  # noqa: E402
import sa_abi  # noqa: E402


def structs():
    return [
        (name, getattr(sa_abi, name))
        for name in dir(sa_abi)
        if isinstance(getattr(sa_abi, name), type)
        and issubclass(getattr(sa_abi, name), ctypes.Structure)
    ]


class GeneratedModuleTest(unittest.TestCase):
    def test_module_is_what_the_header_generates(self):
        with open(gen_abi.HEADER) as f:
            expected = gen_abi.generate(f.read())
        with open(gen_abi.MODULE) as f:
            self.assertEqual(
                f.read(), expected, "bench/sa_abi.py is stale: run python3 bench/gen_abi.py"
            )

    def test_a_header_change_is_seen(self):
        with open(gen_abi.HEADER) as f:
            header = f.read()
        changed = header.replace(
            "int32_t deterministic;", "int32_t deterministic;\n  int64_t planted;"
        )
        self.assertNotEqual(changed, header)
        self.assertIn('("planted", ctypes.c_int64)', gen_abi.generate(changed))
        self.assertNotEqual(gen_abi.generate(changed), gen_abi.generate(header))

    def test_unknown_syntax_is_an_error_not_a_guess(self):
        with self.assertRaises(gen_abi.ParseError):
            gen_abi.generate(
                "typedef struct sa_x { unsigned long long v; } sa_x;\n"
                "enum sa_e { A = 0 };\nSA_API int sa_f(void);"
            )

    def test_layout_matches_the_compiler(self):
        cxx = os.environ.get("SA_CXX") or shutil.which("c++") or shutil.which("g++")
        if not cxx:
            self.skipTest("no C++ compiler found (set SA_CXX)")
        lines = [
            "#include <cstddef>",
            "#include <cstdio>",
            '#include "strideattn/strideattn.h"',
            "int main() {",
        ]
        expected = []
        for name, cls in structs():
            lines.append(f'  std::printf("%zu\\n", sizeof({name}));')
            expected.append(ctypes.sizeof(cls))
            for field, _ in cls._fields_:
                lines.append(f'  std::printf("%zu\\n", offsetof({name}, {field}));')
                expected.append(getattr(cls, field).offset)
        lines.append("}")
        with tempfile.TemporaryDirectory() as tmp:
            src, exe = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe")
            with open(src, "w") as f:
                f.write("\n".join(lines) + "\n")
            subprocess.run(
                [cxx, "-std=c++17", "-I", os.path.join(REPO, "include"), src, "-o", exe], check=True
            )
            got = [
                int(x)
                for x in subprocess.run(
                    [exe], capture_output=True, text=True, check=True
                ).stdout.split()
            ]
        self.assertEqual(got, expected)
        self.assertGreater(len(expected), 40)


@unittest.skipUnless(os.environ.get("SA_C_LIB"), "SA_C_LIB (path of libstrideattn_c.so) not set")
class LibraryCallTest(unittest.TestCase):
    def setUp(self):
        self.lib = sa_abi.load(os.environ["SA_C_LIB"])
        self.msg = ctypes.create_string_buffer(1024)

    def view(self, buf, shape):
        # [b, s, h, d] contiguous f32 strides
        b, s, h, d = shape
        return sa_abi.sa_tensor_view(
            ctypes.addressof(buf),
            sa_abi.SA_F32,
            (ctypes.c_int64 * 4)(*shape),
            (ctypes.c_int64 * 4)(s * h * d, h * d, d, 1),
        )

    def args(self, q, k, v, o, lse, s_q, s_kv, d, causal):
        a = sa_abi.sa_forward_args()
        a.struct_size = ctypes.sizeof(a)
        a.q, a.k, a.v = (
            self.view(q, (1, s_q, 1, d)),
            self.view(k, (1, s_kv, 1, d)),
            self.view(v, (1, s_kv, 1, d)),
        )
        a.o = self.view(o, (1, s_q, 1, d))
        a.lse = sa_abi.sa_lse_view(
            ctypes.addressof(lse),
            (ctypes.c_int64 * 3)(1, 1, s_q),
            (ctypes.c_int64 * 3)(s_q, s_q, 1),
        )
        a.options.mask = sa_abi.SA_MASK_CAUSAL if causal else sa_abi.SA_MASK_NONE
        a.backend = sa_abi.SA_BACKEND_REFERENCE
        a.memory = sa_abi.SA_MEMORY_HOST
        return a

    def test_version_and_names(self):
        self.assertRegex(self.lib.sa_version().decode(), r"^\d+\.\d+\.\d+")
        self.assertEqual(self.lib.sa_status_name(sa_abi.SA_INVALID_ARGUMENT), b"invalid_argument")
        self.assertEqual(self.lib.sa_backend_compiled(sa_abi.SA_BACKEND_REFERENCE), 1)

    def test_forward_matches_plain_python(self):
        rng = random.Random(int.from_bytes(os.urandom(4), "little"))
        s_q, s_kv, d = 3, 5, 8
        F = ctypes.c_float
        q = (F * (s_q * d))(*[rng.gauss(0, 1) for _ in range(s_q * d)])
        k = (F * (s_kv * d))(*[rng.gauss(0, 1) for _ in range(s_kv * d)])
        v = (F * (s_kv * d))(*[rng.gauss(0, 1) for _ in range(s_kv * d)])
        o = (F * (s_q * d))(*[float("nan")] * (s_q * d))
        lse = (F * s_q)(*[float("nan")] * s_q)
        a = self.args(q, k, v, o, lse, s_q, s_kv, d, causal=True)
        rc = self.lib.sa_forward(ctypes.byref(a), self.msg, len(self.msg))
        self.assertEqual(rc, sa_abi.SA_OK, self.msg.value)
        scale = 1 / math.sqrt(d)
        for i in range(s_q):
            keys = range(0, i + 1)  # causal, top-left aligned
            sc = [scale * sum(q[i * d + x] * k[j * d + x] for x in range(d)) for j in keys]
            m = max(sc)
            z = sum(math.exp(x - m) for x in sc)
            self.assertAlmostEqual(lse[i], m + math.log(z), places=4)
            for x in range(d):
                want = sum(math.exp(sc[n] - m) / z * v[j * d + x] for n, j in enumerate(keys))
                self.assertAlmostEqual(o[i * d + x], want, places=4)

    def test_bad_head_dim_stride_is_refused_with_its_value(self):
        F = ctypes.c_float
        bufs = [(F * 64)() for _ in range(4)]
        lse = (F * 4)()
        a = self.args(*bufs, lse, 2, 2, 8, causal=False)
        a.k.stride[3] = 2
        rc = self.lib.sa_forward(ctypes.byref(a), self.msg, len(self.msg))
        self.assertEqual(rc, sa_abi.SA_INVALID_ARGUMENT)
        self.assertIn(b"stride", self.msg.value)
        self.assertIn(b"2", self.msg.value)


if __name__ == "__main__":
    unittest.main()
