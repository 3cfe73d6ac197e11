#!/usr/bin/env python3
"""bench/host_overhead.py where no GPU (and no PyTorch) is needed: its command line (--help,
bad --shape / --layers / --calls refused), no PyTorch: exit 2 saying why, and how measured
rows become the data file and the rendered table (ratios against each SDPA column)."""

import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "bench", "host_overhead.py")
sys.path.insert(0, os.path.join(REPO, "bench"))
import host_overhead as ho  # noqa: E402
import render  # noqa: E402


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


class CommandLineTest(unittest.TestCase):
    def test_help(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        for opt in ("--device", "--shape", "--backends", "--layers", "--calls", "--profile"):
            self.assertIn(opt, r.stdout)

    def test_bad_arguments_are_refused(self):
        for args, msg in (
            (("--shape", "1,2,3"), "four positive integers"),
            (("--shape", "1,0,2,3"), "four positive integers"),
            (("--layers", "op,bogus"), "unknown bogus"),
            (("--calls", "0"), "must be >= 1"),
        ):
            r = run(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(msg, r.stderr, args)

    def test_without_torch_exits_2_saying_why(self):
        try:
            import torch  # noqa: F401

            self.skipTest("PyTorch is installed here")
        except ImportError:
            pass
        with tempfile.TemporaryDirectory() as tmp:
            r = run("--results-dir", tmp)
            self.assertEqual(r.returncode, 2)
            self.assertIn("nothing to measure", r.stderr)
            self.assertEqual(os.listdir(tmp), [])


class RowsTest(unittest.TestCase):
    def test_rows_ratios_and_table(self):
        cols = [ho.Column(n, layer, be, None, None) for n, layer, be in (
            ("sdpa-flash", "sdpa", "flash"), ("sdpa-cudnn", "sdpa", "cudnn"),
            ("op auto", "op", "auto"), ("op cuda", "op", "cuda"))]  # fmt: skip
        result = {
            ("sdpa-flash", "fwd"): (40.0, 80.0),
            ("sdpa-cudnn", "fwd"): (50.0, 100.0),
            ("op auto", "fwd"): (44.0, 90.0),
            ("op cuda", "fwd"): "error: backend cuda is not compiled in",
        }
        misses = {(c.name, "fwd"): 0 for c in cols}
        misses[("op auto", "fwd")] = 3
        rows = ho.data_rows(cols, ["fwd"], result, ["sdpa-flash", "sdpa-cudnn"],
                            ho.METRICS["cuda"], misses)  # fmt: skip
        self.assertEqual(len(rows), 4)
        self.assertEqual(rows[2]["plan_misses"], 3)  # op and module rows carry theirs
        self.assertNotIn("plan_misses", rows[0])
        op = rows[2]
        self.assertEqual((op["enqueue_us"], op["synced_us"]), (44.0, 90.0))
        self.assertEqual(op["ratios"]["synced_us/sdpa-flash"], 1.125)
        self.assertEqual(op["ratios"]["enqueue_us/sdpa-cudnn"], 0.88)
        self.assertNotIn("synced_us/sdpa-flash", rows[0]["ratios"])  # not against itself
        self.assertIsNone(rows[3]["synced_us"])
        data = {"device": "cuda", "metrics": list(ho.METRICS["cuda"]),
                "peers": ["sdpa-flash", "sdpa-cudnn"], "rows": rows}  # fmt: skip
        table = render.host_table(data)
        self.assertEqual(
            table.splitlines()[0],
            "| column | mode | enqueue µs | synced µs | enqueue/sdpa-flash | synced/sdpa-flash "
            "| enqueue/sdpa-cudnn | synced/sdpa-cudnn |",
        )
        self.assertIn("| op auto | fwd | 44.0 | 90.0 | 1.10 | 1.12 | 0.88 | 0.90 |", table)
        self.assertIn("| op cuda | fwd | — | — | — | — | — | — |", table)
        self.assertIn("- op cuda fwd: error: backend cuda is not compiled in", table)

    def test_repeats_follow_a_balanced_order(self):
        # measure() on the CPU path with plain functions: every (column, mode) once per
        # repeat, in the orders of a Williams design, so that over a whole design each
        # measurement runs right after every other one equally often.
        log = []

        def column(name):
            return ho.Column(name, "op", "cpu", lambda: log.append((name, "fwd")),
                             lambda: log.append((name, "fwd+bwd")))  # fmt: skip

        cols = [column(n) for n in ("a", "b", "c")]
        saved = ho.plans_made
        ho.plans_made = lambda: None
        try:
            result, misses = ho.measure(cols, ["fwd", "fwd+bwd"], 1, 6, cuda=False)
        finally:
            ho.plans_made = saved
        self.assertIsNone(misses)
        self.assertEqual(len(result), 6)
        timed = log[6 * 20 :]  # after the warm-up (max(20, calls // 10) calls each)
        self.assertEqual(len(timed), 36)
        units = [(c, m) for c in "abc" for m in ("fwd", "fwd+bwd")]
        for r in range(6):
            self.assertEqual(sorted(timed[6 * r : 6 * r + 6]), sorted(units))
        follows = {}  # (within a repeat)
        for r in range(6):
            block = timed[6 * r : 6 * r + 6]
            for a, b in zip(block, block[1:]):
                follows[(a, b)] = follows.get((a, b), 0) + 1
        self.assertEqual(len(follows), 30)  # every ordered pair of the 6 measurements
        self.assertEqual(set(follows.values()), {1})

    def test_the_recorded_host_data_loads(self):
        files = render.host_files(render.RESULTS)
        self.assertTrue(files, "no host-time data file in bench/results/host/")
        for path, data in files:
            self.assertEqual(data["metrics"], list(ho.METRICS[data["device"]]), path)
            for r in data["rows"]:
                for m in data["metrics"]:
                    self.assertIn(m, r, f"{path}: {r['column']} {r['mode']} lacks {m}")


if __name__ == "__main__":
    unittest.main()
