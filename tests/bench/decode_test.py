#!/usr/bin/env python3
"""bench/decode.py where no GPU is needed: its command line (--help, bad --runs) and the
markdown table a run's rows render into (bandwidth, share of the copy, ratio to SDPA, rows
without an SDPA column)."""

import os
import subprocess
import sys
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "bench", "decode.py")
sys.path.insert(0, os.path.join(REPO, "bench"))
import decode  # noqa: E402


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


class DecodeBenchTest(unittest.TestCase):
    def test_help_and_bad_runs(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        for opt in ("--lib", "--runs", "--results-dir", "--quick"):
            self.assertIn(opt, r.stdout)
        r = run("--runs", "5")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--runs must be >= 20", r.stderr)

    def test_bytes_and_table(self):
        self.assertEqual(decode.kv_bytes(1, 32768, 8), 32768 * 8 * 128 * 4)
        self.assertAlmostEqual(decode.gbps(4e9, 1.0), 4000.0)
        self.assertIsNone(decode.gbps(1.0, None))
        base = {"case": "decode", "b": 1, "s_q": 1, "s_kv": 32768, "h": 32, "hg": 8}
        rows = [
            {
                **base,
                "layout": "contiguous",
                "ms": 0.1,
                "gbps": 2400.0,
                "sdpa_gbps": 2000.0,
                "eager_gbps": 900.0,
                "sdpa_eager_gbps": 1500.0,
            },
            {**base, "layout": "paged 16", "ms": 0.1, "gbps": 2400.0, "sdpa_gbps": None},
        ]
        text = decode.render_table(4800.0, rows)
        self.assertIn("device-to-device copy: 4,800 GB/s", text)
        lines = text.splitlines()
        self.assertEqual(len(lines), 9)
        self.assertIn(
            "| decode | 1 | 1 | 32768 | 32/8 | contiguous | 0.100 | 2,400 | 50.0 | 2,000 | 1.20"
            " | 900 | 1,500 |",
            lines[7],
        )
        self.assertTrue(lines[8].endswith("| - | - | - | - |"))


if __name__ == "__main__":
    unittest.main()
