#!/usr/bin/env python3
"""bench/features.py where no GPU (and no PyTorch) is needed: its command line (--help, the
defaults, bad values refused, no PyTorch / no CUDA device: exit 2 saying why), how a
measurement's runs are split over interleaved rounds, and how a run's rows become costs,
the target checks and the tables bench/render.py prints and renders into bench/README.md."""

import copy
import json
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "bench", "features.py")
sys.path.insert(0, os.path.join(REPO, "bench"))
import features  # noqa: E402
import render  # noqa: E402


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def row(column, feature, mode, ms=None, status="ok", **extra):
    return {"column": column, "feature": feature, "mode": mode, "ms": ms,
            "runs": 40 if status == "ok" else 0, "status": status, **extra}  # fmt: skip


def synthetic():
    """A run's data as features.py writes it: cuda measured, cudnn refusing the features."""
    rows = []
    times = {  # (feature, mode) -> cuda ms
        ("plain", "fwd"): 1.0, ("plain", "fwd+bwd"): 4.0,
        ("bias", "fwd"): 1.25, ("bias", "fwd+bwd"): 4.2,
        ("alibi", "fwd"): 1.05, ("alibi", "fwd+bwd"): 4.5,
    }  # fmt: skip
    for (feature, mode), ms in times.items():
        rows.append(row("cuda", feature, mode, ms, check="ok"))
    rows.append(row("cuda", "dropout", "fwd", status="refused", reason="dropout: not yet"))
    rows.append(row("cuda", "dropout", "fwd+bwd", status="refused", reason="dropout: not yet"))
    for mode, ms in (("fwd", 0.8), ("fwd+bwd", 3.5)):
        rows.append(row("cudnn", "plain", mode, ms, check="ok"))
        for feature in ("bias", "alibi", "dropout"):
            rows.append(row("cudnn", feature, mode, status="refused", reason=f"{feature}: cuda"))
    for mode, scale in (("fwd", 1), ("fwd+bwd", 4)):
        rows.append(row("sdpa-flash", "plain", mode, 1.1 * scale))
        rows.append(row("sdpa-flash", "dropout", mode, 1.4 * scale))
        rows.append(row("sdpa-efficient", "plain", mode, 1.6 * scale))
        rows.append(row("sdpa-efficient", "bias", mode, 2.0 * scale, note="causal folded"))
        rows.append(row("sdpa-cudnn", "plain", mode, 0.7 * scale))
        rows.append(row("sdpa-cudnn", "bias", mode, status="refused", reason="No available kernel"))
    return {
        "format": render.FEATURES_FORMAT,
        "date": "2026-12-03",
        "commit": "abc1234",
        "gpu": "NVIDIA H200",
        "command": "python3 bench/features.py",
        "versions": {"torch": "2.11.0", "cudnn": "91900", "strideattn": "0.1.0"},
        "protocol": {"runs": 40, "rounds": 4, "warmup": 5, "timer": "CUDA events, median"},
        "shape": {
            "b": 4,
            "h": 16,
            "hg": 16,
            "s": 4096,
            "d": 128,
            "dtype": "bf16",
            "mask": "causal",
        },  # fmt: skip
        "options": {"softcap": 30.0, "dropout_p": 0.1},
        "backends": ["cuda", "cudnn"],
        "features": ["plain", "bias", "alibi", "dropout"],
        "targets": features.TARGETS,
        "rows": rows,
    }


class CommandLineTest(unittest.TestCase):
    def test_help(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        for opt in ("--lib", "--results-dir", "--quick", "--runs", "--rounds", "--warmup",
                    "--features", "--backends", "--shape", "--no-sdpa"):  # fmt: skip
            self.assertIn(opt, r.stdout)

    def test_defaults(self):
        a = features.parse_args([])
        self.assertEqual(a.shape, (4, 16, 4096, 128))
        self.assertEqual((a.runs, a.rounds), (40, 4))
        self.assertEqual(a.features, features.FEATURES)
        self.assertEqual(a.backends, ["cuda", "cudnn"])
        self.assertTrue(a.results_dir.endswith(os.path.join("bench", "results", "features")))
        q = features.parse_args(["--quick"])
        self.assertEqual((q.shape, q.runs, q.rounds), ((1, 16, 4096, 128), 20, 2))
        o = features.parse_args(["--features", "dropout, bias", "--shape", "2,8,1024,64"])
        self.assertEqual(o.features, ["plain", "bias", "dropout"])  # plain first, fixed order
        self.assertEqual(o.shape, (2, 8, 1024, 64))

    def test_bad_values_are_refused(self):
        for args, said in (
            (["--runs", "5"], "--runs must be >= 20"),
            (["--rounds", "0"], "--rounds 0: must be between 1 and --runs (40)"),
            (["--runs", "20", "--rounds", "21"], "--rounds 21"),
            (["--features", "bias,rope"], "--features: unknown rope"),
            (["--backends", "cuda,reference"], "--backends: unknown reference"),
            (["--shape", "4,16,4096"], "expected four positive integers"),
            (["--shape", "4,0,4096,128"], "expected four positive integers"),
        ):
            with self.subTest(args=args):
                r = run(*args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(said, r.stderr)

    def test_without_torch_or_gpu_exits_2_saying_why(self):
        try:
            import torch

            if torch.cuda.is_available():
                self.skipTest("a CUDA device is present: this path is for machines without one")
        except ImportError:
            pass
        never = os.path.join(tempfile.gettempdir(), "features-test-never")
        r = run("--quick", "--results-dir", never)
        self.assertEqual(r.returncode, 2)
        self.assertRegex(r.stderr, r"PyTorch is not installed|no CUDA device")
        self.assertFalse(os.path.exists(never))


class RoundsTest(unittest.TestCase):
    def test_runs_are_split_over_interleaved_rounds(self):
        calls = []

        def fake_event_times(fn, runs, warmup):
            calls.append((fn, runs, warmup))
            return [float(fn)] * runs

        cases = [
            features.Case("cuda", "plain", "fwd", fn=1),
            features.Case("cuda", "bias", "fwd", fn=2),
        ]
        cases.append(features.Case("cudnn", "bias", "fwd", status="refused", reason="no"))
        saved = features.event_times
        features.event_times = fake_event_times
        try:
            features.time_cases(cases, runs=22, rounds=4, warmup=3)
        finally:
            features.event_times = saved
        # 22 runs over 4 rounds: 6, 6, 5, 5; the cases take turns in each round, in the orders
        # of a Williams design (here: each case first in every other round)
        self.assertEqual(calls, [(1, 6, 3), (2, 6, 3), (2, 6, 3), (1, 6, 3),
                                 (1, 5, 3), (2, 5, 3), (2, 5, 3), (1, 5, 3)])  # fmt: skip
        self.assertEqual(cases[0].row()["ms"], 1.0)
        self.assertEqual(cases[0].row()["runs"], 22)
        refused = cases[2].row()
        self.assertEqual(
            (refused["ms"], refused["status"], refused["reason"]), (None, "refused", "no")
        )

    def test_a_run_failing_is_recorded_and_the_others_go_on(self):
        def flaky(fn, runs, warmup):
            if fn == 2:
                raise RuntimeError("CUDA error: an illegal memory access\nmore")
            return [1.0] * runs

        cases = [
            features.Case("cuda", "plain", "fwd", fn=1),
            features.Case("cuda", "bias", "fwd", fn=2),
        ]
        saved = features.event_times
        features.event_times = flaky
        try:
            features.time_cases(cases, runs=20, rounds=2, warmup=1)
        finally:
            features.event_times = saved
        self.assertEqual(cases[0].row()["runs"], 20)
        bad = cases[1].row()
        self.assertEqual((bad["status"], bad["ms"]), ("error", None))
        self.assertEqual(bad["reason"], "CUDA error: an illegal memory access")


class CostAndTableTest(unittest.TestCase):
    def test_targets_are_issue_19s(self):
        tg = features.TARGETS
        self.assertEqual((tg["backend"], tg["mode"]), ("cuda", "fwd+bwd"))
        for f in ("bias", "bias-bcast", "alibi", "softcap", "sinks"):
            self.assertEqual(tg["max_cost"][f], 0.10)
        self.assertEqual(tg["max_cost"]["dropout"], 0.15)
        self.assertIn(["dropout", "sdpa-flash", 1.0], tg["min_speed"])
        self.assertIn(["bias", "sdpa-efficient", 1.0], tg["min_speed"])
        self.assertIn(["dropout", "sdpa-cudnn"], tg["like_plain"])

    def test_cost_and_speed(self):
        d = synthetic()
        self.assertAlmostEqual(render.feature_cost(d, "cuda", "bias", "fwd"), 0.25)
        self.assertAlmostEqual(render.feature_cost(d, "cuda", "bias", "fwd+bwd"), 0.05)
        self.assertAlmostEqual(render.feature_cost(d, "cuda", "plain", "fwd"), 0.0)
        self.assertIsNone(render.feature_cost(d, "cuda", "dropout", "fwd+bwd"))  # refused
        self.assertIsNone(render.feature_cost(d, "cudnn", "bias", "fwd"))
        self.assertIsNone(render.feature_cost(d, "cuda", "softcap", "fwd"))  # not asked
        # speed: the peer's time over ours
        self.assertAlmostEqual(
            render.feature_speed(d, "cuda", "bias", "sdpa-efficient", "fwd+bwd"), 8.0 / 4.2
        )
        self.assertIsNone(render.feature_speed(d, "cuda", "bias", "sdpa-cudnn", "fwd+bwd"))
        d["rows"][0]["status"] = "error"  # cuda plain fwd: no base, no cost
        self.assertIsNone(render.feature_cost(d, "cuda", "bias", "fwd"))

    def test_table(self):
        text = render.features_table(synthetic())
        lines = text.splitlines()
        self.assertEqual(
            lines[0],
            "| feature | mode | cuda ms | cuda cost | cudnn ms | cudnn cost | SDPA flash ms | "
            "SDPA efficient ms | SDPA cuDNN ms |",
        )
        self.assertEqual(
            lines[2], "| plain | fwd | 1.000 | — | 0.800 | — | 1.100 | 1.600 | 0.700 |"
        )
        self.assertIn("| bias | fwd | 1.250 | +25.0% | refused | — | — | 2.000 | refused |", lines)
        self.assertIn("| alibi | fwd+bwd | 4.500 | +12.5% | refused | — | — | — | — |", lines)
        self.assertIn("| dropout | fwd+bwd | refused | — | refused | — | 5.600 | — | — |", lines)
        # the targets, against cuda at fwd+bwd
        self.assertIn("| target (cuda, fwd+bwd) | measured | needed | met |", lines)
        self.assertIn("| bias: cost | +5.0% | <= +10.0% | yes |", lines)
        self.assertIn("| alibi: cost | +12.5% | <= +10.0% | NO |", lines)
        self.assertIn("| dropout: cost | — | <= +15.0% | — |", lines)
        self.assertIn("| bias: speed over SDPA efficient with it | 1.90x | >= 1.00x | yes |", lines)
        self.assertIn("| dropout: speed over SDPA flash with it | — | >= 1.00x | — |", lines)
        self.assertIn("| bias: speed over SDPA cuDNN with it | — | >= 0.70x (plain's) | — |", lines)
        self.assertFalse(any("softcap" in x or "bias-bcast" in x for x in lines))  # not asked
        # the notes: one line per reason, both modes named
        notes = text[text.index("Notes:") :].splitlines()
        self.assertIn("- cuda dropout (fwd, fwd+bwd): refused: dropout: not yet", notes)
        self.assertIn("- sdpa-efficient bias (fwd, fwd+bwd): causal folded", notes)
        self.assertIn("- sdpa-cudnn bias (fwd, fwd+bwd): refused: No available kernel", notes)

    def test_like_plain_target_is_met_or_not(self):
        d = synthetic()
        d["rows"] = [
            r for r in d["rows"] if not (r["column"] == "sdpa-cudnn" and r["feature"] == "bias")
        ]
        d["rows"].append(row("sdpa-cudnn", "bias", "fwd+bwd", 3.0))  # 3.0 / 4.2 = 0.71 >= 0.70
        self.assertIn("| bias: speed over SDPA cuDNN with it | 0.71x | >= 0.70x (plain's) | yes |",
                      render.features_targets(d))  # fmt: skip
        d["rows"][-1]["ms"] = 2.9  # 0.69 < 0.70
        self.assertIn("| 0.69x | >= 0.70x (plain's) | NO |", render.features_targets(d))

    def test_a_failed_check_is_a_note(self):
        d = synthetic()
        d["rows"][2]["check"] = "O equals the plain problem's: the option had no effect"
        text = render.features_table(d)
        self.assertIn(
            "- cuda bias (fwd): check failed: O equals the plain problem's: the option had no effect",
            text,
        )

    def test_data_files_render_into_the_readme_section(self):
        d = synthetic()
        with tempfile.TemporaryDirectory() as tmp:
            self.assertIn("No training-features data", render.features_summary(tmp))
            os.makedirs(os.path.join(tmp, "features"))
            older = copy.deepcopy(d)
            older["date"], older["commit"] = "2026-12-01", "0000000"
            for data in (older, d):
                name = f"{data['date']}-nvidia-h200-{data['commit']}.json"
                with open(os.path.join(tmp, "features", name), "w") as f:
                    f.write(render.dumps(data))
            with open(os.path.join(tmp, "features", name)) as f:
                self.assertEqual(json.load(f), d)  # the data file round-trips
            text = render.features_summary(tmp)
            self.assertTrue(
                text.startswith("### NVIDIA H200\n- `2026-12-03-nvidia-h200-abc1234.json`")
            )
            self.assertNotIn("0000000", text)  # the newest file of the GPU only
            self.assertIn(render.features_header(d), text)
            self.assertIn(render.features_table(d), text)
            readme = f"x\n{render.BEGIN}\n{render.END}\n{render.FEATURES_BEGIN}\nold\n{render.FEATURES_END}\n"
            os.makedirs(os.path.join(tmp, "empty"))
            out = render.render_readme(readme, tmp)
            self.assertIn("| bias: cost | +5.0% | <= +10.0% | yes |", out)
            self.assertNotIn("\nold\n", out)
            d["format"] = "strideattn-bench/1"
            with open(os.path.join(tmp, "features", "bad.json"), "w") as f:
                f.write(render.dumps(d))
            with self.assertRaises(ValueError):
                render.features_files(tmp)

    def test_header(self):
        h = render.features_header(synthetic())
        self.assertIn("GPU NVIDIA H200, torch 2.11.0, cuDNN 91900", h)
        self.assertIn("b 4, h 16, s 4096, d 128, bf16, causal", h)
        self.assertIn("median of 40 runs in 4 interleaved rounds after 5 warm-ups each", h)
        self.assertIn("options: softcap 30.0; dropout_p 0.1", h)


if __name__ == "__main__":
    unittest.main()
