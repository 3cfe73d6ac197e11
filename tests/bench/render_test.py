#!/usr/bin/env python3
"""bench/render.py: results are data. The summary in bench/README.md must be exactly what
the data files in bench/results/ render to; rendering is deterministic; the table has the
columns compare_sdpa.py has always printed; a changed number or a missing marker is caught.
Runs without a GPU (stdlib only)."""

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
import render  # noqa: E402


def newest_file():
    return render.data_files(render.RESULTS)[-1]


class RenderTest(unittest.TestCase):
    def test_readme_is_up_to_date_with_the_data(self):
        rc = subprocess.run(
            [sys.executable, os.path.join(REPO, "bench", "render.py"), "--check"],
            capture_output=True,
            text=True,
        )
        self.assertEqual(rc.returncode, 0, rc.stderr)

    def test_every_data_file_loads_and_has_the_table_columns(self):
        files = render.data_files(render.RESULTS)
        self.assertGreater(len(files), 0, "bench/results/ holds no data file")
        for path, data in files:
            self.assertTrue(data["rows"], path)
            for r in data["rows"]:
                for key in ("shape", "b", "h", "hg", "s", "d", "mask", "dtype", "mode", "tflops"):
                    self.assertIn(key, r, f"{path}: row without {key}")
                for col in render.PEERS + data["backends"]:
                    self.assertIn(col, r["tflops"], f"{path}: {r['shape']} {r['mode']} lacks {col}")
            name = os.path.basename(path)
            self.assertTrue(name.startswith(data["date"] + "-") and data["commit"] in name, name)

    def test_rendering_is_deterministic(self):
        with open(render.README) as f:
            text = f.read()
        a = render.render_readme(text, render.RESULTS)
        b = render.render_readme(a, render.RESULTS)  # idempotent on its own output
        self.assertEqual(a, b)
        self.assertEqual(render.summary(render.RESULTS), render.summary(render.RESULTS))

    def test_table_format_is_compare_sdpa_s(self):
        rows = [
            {
                "shape": "seed strided",
                "b": 8,
                "h": 16,
                "hg": 1,
                "s": 2048,
                "d": 64,
                "mask": "causal",
                "dtype": "fp16",
                "mode": "fwd",
                "tflops": {"sdpa-flash": 183.4, "sdpa-cudnn": 290.0, "cuda": 238.2, "cudnn": None},
                "not_measured": {"cudnn": "n/a: unsupported"},
            }
        ]
        got = render.table(rows, ["cuda", "cudnn"])
        self.assertEqual(
            got.splitlines()[0],
            "| shape (b, h/hg, s, d) | mask | dtype | mode | SDPA flash | SDPA cuDNN | "
            "ours cuda | cuda/flash | cuda/sdpa-cudnn | ours cudnn | cudnn/flash | "
            "cudnn/sdpa-cudnn |",
        )
        self.assertEqual(
            got.splitlines()[2],
            "| seed strided: 8, 16/1, 2048, 64 | causal | fp16 | fwd | 183 | 290 | 238 | "
            "1.30 | 0.82 | — | — | — |",
        )
        self.assertIn("Not measured:\n- seed strided fwd cudnn: n/a: unsupported", got)

    def test_a_changed_number_makes_the_check_fail(self):
        path, data = newest_file()
        with tempfile.TemporaryDirectory() as tmp:
            results = os.path.join(tmp, "results")
            shutil.copytree(render.RESULTS, results)  # the host-time data in results/host too
            readme = os.path.join(tmp, "README.md")
            shutil.copy(render.README, readme)
            check = [
                sys.executable,
                os.path.join(REPO, "bench", "render.py"),
                "--check",
                "--results",
                results,
                "--readme",
                readme,
            ]
            self.assertEqual(subprocess.run(check, capture_output=True).returncode, 0)
            planted = copy.deepcopy(data)
            planted["rows"][0]["tflops"]["cuda"] = 9999
            planted["rows"][0].pop("ratios", None)
            with open(os.path.join(results, os.path.basename(path)), "w") as f:
                f.write(render.dumps(planted))
            rc = subprocess.run(check, capture_output=True, text=True)
            self.assertEqual(rc.returncode, 1)
            self.assertIn("out of date", rc.stderr)

    def test_a_changed_host_time_makes_the_check_fail(self):
        files = render.host_files(render.RESULTS)
        self.assertTrue(files, "no host-time data in bench/results/host/")
        path, data = files[-1]
        with tempfile.TemporaryDirectory() as tmp:
            results = os.path.join(tmp, "results")
            shutil.copytree(render.RESULTS, results)
            readme = os.path.join(tmp, "README.md")
            shutil.copy(render.README, readme)
            planted = copy.deepcopy(data)
            planted["rows"][0][planted["metrics"][0]] = 9999.0
            with open(os.path.join(results, "host", os.path.basename(path)), "w") as f:
                f.write(render.dumps(planted))
            rc = subprocess.run(
                [sys.executable, os.path.join(REPO, "bench", "render.py"), "--check",
                 "--results", results, "--readme", readme],
                capture_output=True, text=True,
            )  # fmt: skip
            self.assertEqual(rc.returncode, 1)
            self.assertIn("out of date", rc.stderr)

    def test_newer_partial_run_replaces_only_its_rows(self):
        path, data = newest_file()
        newer = copy.deepcopy(data)
        newer["date"], newer["commit"] = "9999-12-31", "fffffff"
        newer["rows"] = [dict(copy.deepcopy(data["rows"][0]), ratios={})]
        newer["rows"][0]["tflops"]["cuda"] = 1234.0
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(path, tmp)
            with open(os.path.join(tmp, "9999-12-31-gpu-fffffff.json"), "w") as f:
                f.write(render.dumps(newer))
            text = render.summary(tmp)
        lines = [l for l in text.splitlines() if l.startswith("| ")]
        self.assertEqual(len(lines), len(data["rows"]) + 2)  # header, separator, one per row
        self.assertIn("| 1234 |", lines[2])
        self.assertTrue(lines[2].endswith("| fffffff |"), lines[2])
        self.assertTrue(lines[3].endswith(f"| {data['commit']} |"), lines[3])

    def test_a_later_run_of_the_same_day_wins_whatever_its_name(self):
        path, data = newest_file()
        early, late = copy.deepcopy(data), copy.deepcopy(data)
        for d, commit, time, value in (
            (early, "fffffff", "08:00:00", 1111.0),
            (late, "0000000", "09:30:00", 2222.0),
        ):
            d["date"], d["commit"], d["time"] = "9999-12-31", commit, time
            d["rows"] = [dict(copy.deepcopy(data["rows"][0]), ratios={})]
            d["rows"][0]["tflops"]["cuda"] = value
        with tempfile.TemporaryDirectory() as tmp:
            for d in (early, late):  # the early run's name sorts last
                with open(os.path.join(tmp, f"9999-12-31-gpu-{d['commit']}.json"), "w") as f:
                    f.write(render.dumps(d))
            text = render.summary(tmp)
        self.assertIn("| 2222 |", text)
        self.assertNotIn("| 1111 |", text)

    def test_user_path_columns_render_as_a_second_table(self):
        path, data = newest_file()
        newer = copy.deepcopy(data)
        newer["date"], newer["commit"] = "9999-12-31", "eeeeeee"
        newer["user_backends"] = ["auto"]
        newer["rows"] = [copy.deepcopy(data["rows"][0])]
        newer["rows"][0]["tflops"]["torch-auto"] = 321.0
        newer["rows"][0]["ratios"] = {}
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(path, tmp)
            with open(os.path.join(tmp, "9999-12-31-gpu-eeeeeee.json"), "w") as f:
                f.write(render.dumps(newer))
            text = render.summary(tmp)
        self.assertIn("User path:", text)
        user = text[text.index("User path:") :].splitlines()
        rows = [line for line in user if line.startswith("| ") and "| 321 |" in line]
        self.assertEqual(len(rows), 1, text)
        self.assertTrue(rows[0].endswith("| eeeeeee |"))

    def test_missing_markers_are_an_error(self):
        with self.assertRaises(ValueError):
            render.render_readme("# no markers here\n", render.RESULTS)

    def test_dumps_round_trips(self):
        path, data = newest_file()
        self.assertEqual(json.loads(render.dumps(data)), data)
        with open(path) as f:
            self.assertEqual(f.read(), render.dumps(data), "data file not in render.dumps form")


if __name__ == "__main__":
    unittest.main()
