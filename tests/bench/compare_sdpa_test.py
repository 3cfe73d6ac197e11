#!/usr/bin/env python3
"""bench/compare_sdpa.py where no GPU is needed: its command line (--help, bad --runs, an
--only that matches nothing, no PyTorch / no CUDA device: exit 2 saying why), the shape list
against the recorded data, and how measured rows become the data file and the table."""

import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "bench", "compare_sdpa.py")
sys.path.insert(0, os.path.join(REPO, "bench"))
import compare_sdpa as cs  # noqa: E402
import render  # noqa: E402


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


class CommandLineTest(unittest.TestCase):
    def test_help(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        for opt in (
            "--lib",
            "--quick",
            "--only",
            "--backends",
            "--runs",
            "--rounds",
            "--out",
            "--results-dir",
            "--append-results",
            "--fwd-only",
            "--strideattn",
            "--user-backends",
        ):
            self.assertIn(opt, r.stdout)

    def test_runs_below_protocol_is_refused(self):
        r = run("--runs", "5")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--runs must be >= 20", r.stderr)

    def test_rounds_outside_one_to_runs_are_refused(self):
        for rounds in ("0", "21"):
            r = run("--rounds", rounds)
            self.assertEqual(r.returncode, 2, rounds)
            self.assertIn(f"--rounds {rounds}: must be between 1 and --runs (20)", r.stderr)

    def test_negative_warmups_are_refused(self):
        for opt in ("--warmup", "--round-warmup"):
            r = run(opt, "-1")
            self.assertEqual(r.returncode, 2, opt)
            self.assertIn("--warmup and --round-warmup must be >= 0", r.stderr)

    def test_only_takes_comma_separated_parts(self):
        args, shapes = cs.parse_args(["--only", "d256 s1k,seed"])
        names = {sh.name for sh in shapes}
        self.assertTrue(all("d256 s1k" in n or "seed" in n for n in names), names)
        self.assertIn("mha d256 s1k", names)
        self.assertIn("seed strided", names)
        self.assertIsNone(args.rounds)  # main() sizes a balanced order to the columns
        self.assertEqual((args.warmup, args.round_warmup), (5, 2))

    def test_only_without_match_lists_the_names(self):
        r = run("--only", "no-such-shape")
        self.assertEqual(r.returncode, 2)
        self.assertIn("matches no shape", r.stderr)
        self.assertIn("seed strided", r.stderr)

    def test_without_torch_or_gpu_exits_2_saying_why(self):
        try:
            import torch

            if torch.cuda.is_available():
                self.skipTest("a CUDA device is present: this path is for machines without one")
        except ImportError:
            pass
        with self.subTest("no data file is written"):
            r = run("--only", "seed", "--results-dir", os.devnull + "-never")
            self.assertEqual(r.returncode, 2)
            self.assertRegex(r.stderr, r"PyTorch is not installed|no CUDA device")
            self.assertFalse(os.path.exists(os.devnull + "-never"))


class ShapesAndRecordsTest(unittest.TestCase):
    def test_full_list_is_the_recorded_one(self):
        shapes = cs.design_shapes(False)
        self.assertEqual(len(shapes), 3 * 5 * 2 + 5 + 2 + 2)
        self.assertEqual(len(cs.design_shapes(True)), 2 * 2 + 1 + 2 + 2)
        full = [
            (p, d)
            for p, d in render.data_files(render.RESULTS)
            if len(d["rows"]) == 2 * len(shapes)
        ]
        self.assertTrue(full, "no full-list data file in bench/results/")
        recorded = [
            (r["shape"], r["mask"], r["dtype"], r["b"], r["h"], r["hg"], r["s"], r["d"])
            for r in full[-1][1]["rows"]
            if r["mode"] == "fwd"
        ]
        ours = [(s.name, s.mask_name(), s.dtype, s.b, s.h, s.hg, s.s, s.d) for s in shapes]
        self.assertEqual(ours, recorded)

    def test_rows_become_data_and_table(self):
        sh = cs.Shape("gqa 64/8 s8k", 2, 8192, 64, 8, 128, True)
        row = cs.Row(
            sh,
            {
                ("sdpa-flash", "fwd"): 336.4,
                ("sdpa-cudnn", "fwd"): 605.0,
                ("cuda", "fwd"): 412.0,
                ("cudnn", "fwd"): "error: graph build failed",
            },
        )
        data = cs.data_rows([row], ["cuda", "cudnn"], ["fwd"])
        self.assertEqual(len(data), 1)
        d = data[0]
        self.assertEqual(
            (d["h"], d["hg"], d["mask"], d["dtype"], d["layout"]), (64, 8, "causal", "bf16", "bshd")
        )
        self.assertEqual(
            d["tflops"], {"sdpa-flash": 336.4, "sdpa-cudnn": 605.0, "cuda": 412.0, "cudnn": None}
        )
        self.assertAlmostEqual(d["ratios"]["cuda/flash"], 412.0 / 336.4)
        self.assertIsNone(d["ratios"]["cudnn/flash"])
        self.assertEqual(d["not_measured"], {"cudnn": "error: graph build failed"})
        table = render.table(data, ["cuda", "cudnn"])
        self.assertIn(
            "| gqa 64/8 s8k: 2, 64/8, 8192, 128 | causal | bf16 | fwd | 336 | 605 | 412 | 1.22 | 0.68 "
            "| — | — | — |",
            table,
        )
        self.assertIn("- gqa 64/8 s8k fwd cudnn: error: graph build failed", table)

    def test_round_orders_are_balanced(self):
        # A Williams design: over a whole design every column is in every place equally often
        # and right after every other column equally often (a column that always followed the
        # same one measured 0.9x of the same kernel: the state one column leaves falls on the
        # next), for even and odd numbers of columns.
        for n in range(1, 10):
            cols = [f"c{i}" for i in range(n)]
            rounds = cs.balanced_rounds(n)
            self.assertEqual(rounds, n if n % 2 == 0 else 2 * n)
            orders = [cs.round_order(cols, r) for r in range(rounds)]
            for o in orders:
                self.assertEqual(sorted(o), sorted(cols))
            for place in range(n):
                counts = {c: sum(o[place] == c for o in orders) for c in cols}
                self.assertEqual(set(counts.values()), {rounds // n}, (n, place))
            follows = {}
            for o in orders:
                for a, b in zip(o, o[1:]):
                    follows[(a, b)] = follows.get((a, b), 0) + 1
            if n > 1:
                self.assertEqual(len(follows), n * (n - 1), n)  # every ordered pair occurs
                self.assertEqual(set(follows.values()), {rounds // n}, n)
            self.assertEqual(cs.round_order(cols, rounds), orders[0])  # the design repeats
        self.assertEqual(cs.round_order([], 3), [])
        # the five columns of a C-ABI-only run: auto no longer always follows cudnn
        cols = ["sdpa-flash", "sdpa-cudnn", "cuda", "cudnn", "auto"]
        before_auto = {o[o.index("auto") - 1] for o in (cs.round_order(cols, r) for r in range(10))
                       if o.index("auto") > 0}  # fmt: skip
        self.assertEqual(before_auto, {"sdpa-flash", "sdpa-cudnn", "cuda", "cudnn"})

    def test_run_data_renders_the_rows_measured_so_far(self):
        # (the data file main() rewrites after every shape, so a run cut short keeps its rows)
        try:
            import torch
        except ImportError:
            self.skipTest("no PyTorch: run_data records its version")
        saved, cs.torch = cs.torch, torch
        try:
            args, _ = cs.parse_args(["--runs", "20", "--rounds", "2"])
            sh = cs.Shape("mha d128 s4k", 4, 4096, 16, 16, 128, False)
            tflops = {
                ("sdpa-flash", "fwd"): 311.0,
                ("sdpa-cudnn", "fwd"): 624.0,
                ("cuda", "fwd"): 515.0,
            }
            data = cs.run_data(
                args,
                [],
                None,
                "NVIDIA H200",
                "2026-12-04",
                "abc1234",
                ["cuda"],
                [],
                ["fwd"],
                [cs.Row(sh, tflops)],
            )
        finally:
            cs.torch = saved
        self.assertEqual(
            (data["format"], data["commit"], data["protocol"]["rounds"]),
            (render.FORMAT, "abc1234", 2),
        )
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "run.json")
            with open(path, "w") as f:
                f.write(render.dumps(data))
            self.assertEqual(render.load(path)["rows"], data["rows"])
        self.assertEqual(data["rows"][0]["tflops"]["cuda"], 515.0)

    def test_auto_column_is_judged_against_the_faster_backend(self):
        sh = cs.Shape("d128 s4k", 4, 4096, 16, 16, 128, False)
        row = cs.Row(
            sh,
            {
                ("sdpa-flash", "fwd"): 400.0,
                ("sdpa-cudnn", "fwd"): 600.0,
                ("cuda", "fwd"): 450.0,
                ("cudnn", "fwd"): 590.0,
                ("auto", "fwd"): 560.5,
            },
        )
        (d,) = cs.data_rows([row], ["cuda", "cudnn", "auto"], ["fwd"])
        self.assertAlmostEqual(d["ratios"]["auto/best"], 560.5 / 590.0)
        self.assertAlmostEqual(d["ratios"]["auto/sdpa-cudnn"], 560.5 / 600.0)
        table = render.table([d], ["cuda", "cudnn", "auto"])
        self.assertIn("| ours auto | auto/flash | auto/sdpa-cudnn | auto/best |", table)
        self.assertIn("| 560 | 1.40 | 0.93 | 0.95 |", table)
        # one backend missing: judged against the one measured; none: no ratio
        row.tflops[("cudnn", "fwd")] = "error: graph build failed"
        (d,) = cs.data_rows([row], ["cuda", "cudnn", "auto"], ["fwd"])
        self.assertAlmostEqual(d["ratios"]["auto/best"], 560.5 / 450.0)
        (d,) = cs.data_rows([row], ["auto"], ["fwd"])
        self.assertIsNone(d["ratios"]["auto/best"])

    def test_user_path_columns_become_data_and_table(self):
        sh = cs.Shape("seed strided", 8, 2048, 16, 1, 64, True, "fp16", "seed")
        row = cs.Row(
            sh,
            {
                ("sdpa-flash", "fwd"): 198.0,
                ("sdpa-cudnn", "fwd"): 280.0,
                ("cuda", "fwd"): 225.0,
                ("torch-auto", "fwd"): 240.0,
                ("torch-cuda", "fwd"): 220.5,
                ("torch-cudnn", "fwd"): "n/a: unsupported",
            },
        )
        users = ["auto", "cuda", "cudnn"]
        (d,) = cs.data_rows([row], ["cuda"], ["fwd"], users)
        self.assertEqual(d["tflops"]["torch-cuda"], 220.5)
        self.assertIsNone(d["tflops"]["torch-cudnn"])
        self.assertAlmostEqual(d["ratios"]["torch-cuda/cuda"], 220.5 / 225.0)
        self.assertAlmostEqual(d["ratios"]["torch-auto/sdpa-cudnn"], 240.0 / 280.0)
        self.assertNotIn("torch-auto/auto", d["ratios"])  # no C ABI column named auto
        self.assertEqual(d["not_measured"]["torch-cudnn"], "n/a: unsupported")
        table = render.user_table([d], users, ["cuda"])
        self.assertEqual(
            table.splitlines()[0],
            "| shape (b, h/hg, s, d) | mask | dtype | mode | SDPA flash | SDPA cuDNN | "
            "torch auto | torch-auto/sdpa-cudnn | torch cuda | torch-cuda/sdpa-cudnn | "
            "torch-cuda/cuda | torch cudnn | torch-cudnn/sdpa-cudnn |",
        )
        self.assertIn(
            "| seed strided: 8, 16/1, 2048, 64 | causal | fp16 | fwd | 198 | 280 | 240 | 0.86 "
            "| 220 | 0.79 | 0.98 | — | — |",
            table,
        )

    def test_data_file_name(self):
        self.assertEqual(
            cs.data_file_name("2026-12-01", "NVIDIA H200", "abc1234"),
            "2026-12-01-nvidia-h200-abc1234.json",
        )
        self.assertEqual(
            cs.data_file_name("2026-12-01", "NVIDIA A100-SXM4-80GB", "unknown"),
            "2026-12-01-nvidia-a100-sxm4-80gb-unknown.json",
        )

    def test_flops_convention(self):
        sh = cs.Shape("x", 2, 4, 3, 3, 8, True)
        self.assertEqual(sh.flops_fwd(), 2 * (4 * 5 / 2) * 2 * 3 * (8 + 8))
        self.assertEqual(cs.Shape("x", 2, 4, 3, 3, 8, False).flops_fwd(), 2 * 16 * 2 * 3 * 16)
        # window 1 over 4 tokens: rows see 1, 2, 2, 2 keys; a window past the length is causal
        win = cs.Shape("x", 2, 4, 3, 3, 8, True, window=1)
        self.assertEqual(win.flops_fwd(), 2 * 7 * 2 * 3 * 16)
        self.assertEqual(win.mask_name(), "causal, window 1")
        wide = cs.Shape("x", 2, 4, 3, 3, 8, True, window=100)
        self.assertEqual(wide.flops_fwd(), sh.flops_fwd())

    def test_runs_are_taken_in_interleaved_rounds(self):
        """run_shape with the GPU parts replaced: each round visits every column and mode (in
        round_order's order), the runs add up to --runs, warm-ups are --warmup before a
        column's first round and --round-warmup later, and a column's TFLOP/s comes from the
        median of all its runs (a planted slow run in one round does not move it)."""
        calls, planted, warmups = [], [], []
        per_round = ["flash_fwd", "flash_bwd", "cudnn_fwd", "cudnn_bwd", "cuda_fwd", "cuda_bwd"]

        class FakeTorch:
            @staticmethod
            def manual_seed(_):
                pass

            class cuda:  # noqa: N801 - torch's name
                @staticmethod
                def synchronize():
                    pass

        def fake_times(fn, runs, warmup):
            calls.append((fn.__name__, runs))
            warmups.append(warmup)
            slow = fn.__name__ == "cuda_fwd" and len(calls) <= len(per_round)  # the first round
            planted.extend([slow] * runs)
            return [100.0 if slow else 2.0] * runs

        def fns(name):
            def fwd():
                pass

            def fwd_bwd():
                pass

            fwd.__name__, fwd_bwd.__name__ = f"{name}_fwd", f"{name}_bwd"
            return fwd, fwd_bwd

        saved = {
            n: getattr(cs, n)
            for n in ("torch", "make_inputs", "sdpa_fns", "ours_fns", "event_times")
        }
        saved["SDPBackend"] = cs.SDPBackend
        try:
            cs.torch = FakeTorch
            cs.SDPBackend = type("B", (), {"FLASH_ATTENTION": "flash", "CUDNN_ATTENTION": "cudnn"})
            cs.make_inputs = lambda sh: (None, None, None)
            cs.sdpa_fns = lambda sh, q, k, v, backend: fns(backend)
            cs.ours_fns = lambda sa, be, sh, q, k, v: fns(be)
            cs.event_times = fake_times
            sh = cs.Shape("x", 1, 1024, 2, 2, 64, False)
            row = cs.run_shape(
                sh, None, ["cuda"], 21, 3, ["fwd", "fwd+bwd"], rounds=4, round_warmup=1
            )
        finally:
            for n, v in saved.items():
                setattr(cs, n, v)
        order = [name for name, _ in calls]
        self.assertEqual(sum(planted), 6)  # the slow runs were there
        cols = ["flash", "cudnn", "cuda"]  # round_order's column order
        self.assertEqual(
            order,
            [f"{c}_{m}" for r in range(4) for c in cs.round_order(cols, r) for m in ("fwd", "bwd")],
        )
        self.assertEqual(order[:6], per_round)
        self.assertEqual([n for _, n in calls[::6]], [6, 5, 5, 5])  # 21 runs over 4 rounds
        self.assertEqual(warmups, [3] * 6 + [1] * 18)
        expected = sh.flops_fwd() / (2.0 * 1e-3) / 1e12
        self.assertAlmostEqual(row.tflops[("cuda", "fwd")], expected)  # 6 slow runs of 21
        self.assertAlmostEqual(row.tflops[("sdpa-flash", "fwd+bwd")], expected * 3.5)


if __name__ == "__main__":
    unittest.main()
