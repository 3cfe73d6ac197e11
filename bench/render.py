#!/usr/bin/env python3
"""Benchmark results are data: this renders them.

Each run of bench/compare_sdpa.py leaves one JSON file in bench/results/ (format below).
This module turns such a file into the markdown table compare_sdpa.py prints, and renders
the current summary, from the newest data files, into bench/README.md between the markers
`<!-- results:begin -->` and `<!-- results:end -->`.

  python3 bench/render.py            rewrite the summary in bench/README.md
  python3 bench/render.py --check    exit 1 if bench/README.md is not what the data renders

Data file (format "strideattn-bench/1"): date, optional time (UTC; one day's runs are
ordered by it), commit, gpu, command, versions (torch, cudnn, ...), protocol (runs, rounds,
warmup, round_warmup, order, timer, flops), backends (ours, in column order),
optional user_backends (the user-path columns torch-<be>, rendered as a second table), modes,
optional transcribed_from (where hand-copied numbers came from), and rows: shape name, b, h,
hg, s, d, mask, dtype, layout, mode, tflops {column: TFLOP/s}, ratios {"be/flash",
"be/sdpa-cudnn": ours over SDPA}, not_measured {column: reason}.

The summary takes, for each GPU, every (shape, mode) row from the newest file that has it
(newest by date, then file name), so a partial run (--quick, --only) updates its rows and
leaves the others. Rendering depends on the files' contents alone: no clock, no machine.

Host-time data (bench/host_overhead.py, format "strideattn-host/1", in results/host/):
date, commit, machine, device, command, versions, protocol (shape, dtype, mask, calls,
repeats, timer, threads), metrics (the two timings of the device, e.g. enqueue_us and
synced_us), peers (the SDPA columns) and rows: column, layer, backend, mode, each metric,
ratios {"metric/peer": over the peer's}, error. The newest file of
each machine is rendered between `<!-- host:begin -->` and `<!-- host:end -->`.

Training-features data (bench/features.py, format "strideattn-features/1", in
results/features/): date, commit, gpu, command, versions, protocol (runs, rounds, warmup,
timer), shape (b, h, hg, s, d, dtype, mask), options, backends (ours), features (plain
first), targets (backend, mode, max_cost {feature: limit}, min_speed [[feature, peer,
speed]], like_plain [[feature, peer]]) and rows: column (a backend of ours or sdpa-flash,
sdpa-efficient, sdpa-cudnn), feature, mode, ms (median; null unless status is "ok"), runs,
status ("ok", "refused", "error"), optional reason, note, check. Costs and speeds are computed
here from the times. The newest file of each GPU is rendered between
`<!-- features:begin -->` and `<!-- features:end -->`.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(BENCH, "results")
README = os.path.join(BENCH, "README.md")
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
HOST_BEGIN, HOST_END = "<!-- host:begin -->", "<!-- host:end -->"
FORMAT = "strideattn-bench/1"
HOST_FORMAT = "strideattn-host/1"
FEATURES_BEGIN, FEATURES_END = "<!-- features:begin -->", "<!-- features:end -->"
FEATURES_FORMAT = "strideattn-features/1"
PEERS = ["sdpa-flash", "sdpa-cudnn"]


def fmt(x) -> str:
    return f"{x:.0f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "—"


def ratio_cell(row: dict, key: str, ours, peer) -> str:
    if key in row.get("ratios", {}):  # as measured (unrounded) or as recorded
        r = row["ratios"][key]
        return "—" if r is None else f"{r:.2f}"
    ok = all(isinstance(x, (int, float)) for x in (ours, peer))
    return f"{ours / peer:.2f}" if ok and peer > 0 else "—"


def shape_cell(row: dict) -> str:
    hh = f"{row['h']}" if row["h"] == row["hg"] else f"{row['h']}/{row['hg']}"
    return f"{row['shape']}: {row['b']}, {hh}, {row['s']}, {row['d']}"


def table(rows: list[dict], backends: list[str], run_column: bool = False) -> str:
    """The markdown table of compare_sdpa.py for `rows`, then the "Not measured" notes.
    run_column adds the commit each row was measured at (for merged summaries)."""
    head = ["shape (b, h/hg, s, d)", "mask", "dtype", "mode", "SDPA flash", "SDPA cuDNN"]
    for be in backends:
        head += [f"ours {be}", f"{be}/flash", f"{be}/sdpa-cudnn"]
        if be == "auto":  # over the faster of cuda and cudnn in the same run
            head.append("auto/best")
    if run_column:
        head.append("run")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    notes = []
    for r in rows:
        t = r["tflops"]
        fl, cu = t.get("sdpa-flash"), t.get("sdpa-cudnn")
        cells = [shape_cell(r), r["mask"], r["dtype"], r["mode"], fmt(fl), fmt(cu)]
        for be in backends:
            ours = t.get(be)
            cells += [
                fmt(ours),
                ratio_cell(r, f"{be}/flash", ours, fl),
                ratio_cell(r, f"{be}/sdpa-cudnn", ours, cu),
            ]
            if be == "auto":
                best = [t.get(x) for x in ("cuda", "cudnn") if isinstance(t.get(x), (int, float))]
                cells.append(ratio_cell(r, "auto/best", ours, max(best) if best else None))
        if run_column:
            cells.append(r["_run"])
        lines.append("| " + " | ".join(cells) + " |")
        for col in PEERS + backends:
            if col in r.get("not_measured", {}):
                notes.append(f"- {r['shape']} {r['mode']} {col}: {r['not_measured'][col]}")
    out = "\n".join(lines)
    if notes:
        out += "\n\nNot measured:\n" + "\n".join(sorted(set(notes)))
    return out


def user_table(
    rows: list[dict], user_backends: list[str], backends: list[str], run_column=False
) -> str:
    """The user-path table: SDPA's two columns, each torch-<be> column (DotProductAttention
    with autograd) and its ratios over the C ABI's same backend and over SDPA."""
    head = ["shape (b, h/hg, s, d)", "mask", "dtype", "mode", "SDPA flash", "SDPA cuDNN"]
    for be in user_backends:
        head += [f"torch {be}", f"torch-{be}/sdpa-cudnn"]
        if be in backends:
            head.append(f"torch-{be}/{be}")
    if run_column:
        head.append("run")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        t = r["tflops"]
        fl, cu = t.get("sdpa-flash"), t.get("sdpa-cudnn")
        cells = [shape_cell(r), r["mask"], r["dtype"], r["mode"], fmt(fl), fmt(cu)]
        for be in user_backends:
            col = f"torch-{be}"
            cells += [fmt(t.get(col)), ratio_cell(r, f"{col}/sdpa-cudnn", t.get(col), cu)]
            if be in backends:
                cells.append(ratio_cell(r, f"{col}/{be}", t.get(col), t.get(be)))
        if run_column:
            cells.append(r["_run"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def header(data: dict) -> str:
    """The line above the table: GPU, library versions, protocol."""
    v, p = data.get("versions", {}), data.get("protocol", {})
    # (runs taken in interleaved rounds since the protocol has them; older files: one round)
    # (since round_warmup is recorded: the first round's warm-ups, then each later round's)
    if p.get("rounds") and p.get("round_warmup") is not None:
        runs = (
            f"{p.get('runs')} runs in {p['rounds']} interleaved rounds in a balanced order, "
            f"after {p.get('warmup')} warm-ups ({p['round_warmup']} in later rounds)"
        )
    elif p.get("rounds"):
        runs = (
            f"{p.get('runs')} runs in {p['rounds']} interleaved rounds after {p.get('warmup')} "
            "warm-ups each"
        )
    else:
        runs = f"{p.get('runs')} runs after {p.get('warmup')} warm-ups"
    return (
        f"GPU {data['gpu']}, torch {v.get('torch')}, cuDNN {v.get('cudnn')}; "
        f"TFLOP/s ({p.get('flops')}), median of {runs}, {p.get('timer')}"
    )


def run_order(f: tuple[str, dict]) -> tuple[str, str, str]:
    """Oldest first: a (path, data) pair by its date, then its time of day (files written
    before the data had one sort first within their day), then its name."""
    return (f[1]["date"], f[1].get("time", ""), os.path.basename(f[0]))


def load(path: str) -> dict:
    with open(path) as f:
        data = json.load(f)
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: format {data.get('format')!r}, expected {FORMAT!r}")
    for key in ("date", "commit", "gpu", "command", "versions", "protocol", "backends", "rows"):
        if key not in data:
            raise ValueError(f"{path}: no {key!r}")
    return data


def dumps(data: dict) -> str:
    """A data file's text: top-level keys one per line, each row on one line (diffable)."""
    parts = []
    for key, value in data.items():
        if key == "rows":
            rows = ",\n".join("  " + json.dumps(r, ensure_ascii=False) for r in value)
            parts.append(f' "rows": [\n{rows}\n ]')
        else:
            parts.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def data_files(results_dir: str) -> list[tuple[str, dict]]:
    """Every data file, oldest first (by date, then file name)."""
    files = [(p, load(p)) for p in glob.glob(os.path.join(results_dir, "*.json"))]
    return sorted(files, key=run_order)


def summary(results_dir: str) -> str:
    """The markdown between the README markers: per GPU, the newest row of each (shape,
    mode), with the runs it came from."""
    files = data_files(results_dir)
    if not files:
        return "No benchmark data in bench/results/ yet."
    gpus: dict[str, list[tuple[str, dict]]] = {}
    for path, data in reversed(files):  # newest first
        gpus.setdefault(data["gpu"], []).append((path, data))
    parts = []
    for gpu in sorted(gpus):
        rows, seen, used, backends, users = [], set(), [], [], []
        for path, data in gpus[gpu]:
            took = 0
            for r in data["rows"]:
                key = (r["shape"], r["mask"], r["dtype"], r["mode"])
                if key in seen:
                    continue
                seen.add(key)
                rows.append(dict(r, _run=data["commit"]))
                took += 1
            if took:
                used.append((path, data))
                backends += [b for b in data["backends"] if b not in backends]
                users += [b for b in data.get("user_backends", []) if b not in users]
        parts.append(f"### {gpu}")
        for path, data in used:
            src = (
                f"; transcribed from {data['transcribed_from']}"
                if data.get("transcribed_from")
                else ""
            )
            parts.append(
                f"- `{os.path.basename(path)}`: {data['date']}, commit {data['commit']}, "
                f"`{data['command']}`{src}"
            )
        parts.append("")
        parts.append(header(used[0][1]))
        parts.append("")
        parts.append(table(rows, backends, run_column=len(used) > 1))
        parts.append("")
        user_rows = [r for r in rows if any(r["tflops"].get(f"torch-{b}") for b in users)]
        if user_rows:
            parts.append(
                "User path: the same tensors through strideattn.torch.DotProductAttention "
                "with autograd, in the same run (torch-be/be: over the C ABI's same backend)"
            )
            parts.append("")
            parts.append(user_table(user_rows, users, backends, run_column=len(used) > 1))
            parts.append("")
    return "\n".join(parts).rstrip("\n")


# ----------------------------------------------------------------------------- host time


def host_header(data: dict) -> str:
    p, v = data.get("protocol", {}), data.get("versions", {})
    shape = ", ".join(str(x) for x in p.get("shape", []))
    return (
        f"{data['machine']} ({data['device']}), torch {v.get('torch')}; [{shape}] "
        f"{p.get('dtype')}, mask {p.get('mask')}; µs per call, median of {p.get('repeats')} "
        f"repeats of {p.get('calls')} calls ({p.get('timer')}), {p.get('threads')} threads"
    )


def host_table(data: dict) -> str:
    """The table bench/host_overhead.py prints: one row per column and mode, each metric
    (µs per call) and its ratio to the same metric of each SDPA column."""
    metrics, peers = data["metrics"], data.get("peers", [])
    label = lambda m: m[: -len("_us")] if m.endswith("_us") else m  # noqa: E731
    head = ["column", "mode"] + [f"{label(m)} µs" for m in metrics]
    head += [f"{label(m)}/{p}" for p in peers for m in metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    notes = []
    for r in data["rows"]:
        cells = [r["column"], r["mode"]]
        cells += ["—" if r.get(m) is None else f"{r[m]:.1f}" for m in metrics]
        ratios = r.get("ratios", {})
        for p in peers:
            for m in metrics:
                x = ratios.get(f"{m}/{p}")
                cells.append("—" if x is None else f"{x:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
        if r.get("error"):
            notes.append(f"- {r['column']} {r['mode']}: {r['error']}")
    out = "\n".join(lines)
    if notes:
        out += "\n\nNot measured:\n" + "\n".join(notes)
    return out


def host_files(results_dir: str) -> list[tuple[str, dict]]:
    """Every host-time data file in results_dir/host, oldest first."""
    files = []
    for p in glob.glob(os.path.join(results_dir, "host", "*.json")):
        with open(p) as f:
            data = json.load(f)
        if data.get("format") != HOST_FORMAT:
            raise ValueError(f"{p}: format {data.get('format')!r}, expected {HOST_FORMAT!r}")
        for key in (
            "date",
            "commit",
            "machine",
            "device",
            "command",
            "protocol",
            "metrics",
            "rows",
        ):
            if key not in data:
                raise ValueError(f"{p}: no {key!r}")
        files.append((p, data))
    return sorted(files, key=run_order)


def host_summary(results_dir: str) -> str:
    """The newest host-time table of each (machine, device)."""
    newest: dict[tuple[str, str], tuple[str, dict]] = {}
    for path, data in host_files(results_dir):
        newest[(data["machine"], data["device"])] = (path, data)
    if not newest:
        return "No host-time data in bench/results/host/ yet."
    parts = []
    for key in sorted(newest):
        path, data = newest[key]
        parts += [
            f"### {data['machine']}",
            f"- `{os.path.basename(path)}`: {data['date']}, commit {data['commit']}, "
            f"`{data['command']}`",
            "",
            host_header(data),
            "",
            host_table(data),
            "",
        ]
    return "\n".join(parts).rstrip("\n")


# ----------------------------------------------------------------------- training features

FEATURE_SDPA = {
    "sdpa-flash": "SDPA flash",
    "sdpa-efficient": "SDPA efficient",
    "sdpa-cudnn": "SDPA cuDNN",
}
FEATURE_MODES = ["fwd", "fwd+bwd"]


def feature_row(data: dict, column: str, feature: str, mode: str) -> dict | None:
    for r in data["rows"]:
        if (r["column"], r["feature"], r["mode"]) == (column, feature, mode):
            return r
    return None


def feature_ms(data: dict, column: str, feature: str, mode: str) -> float | None:
    """The measured time, or None where the column refused, failed or was not asked."""
    r = feature_row(data, column, feature, mode)
    return r["ms"] if r and r.get("status") == "ok" and r.get("ms") else None


def feature_cost(data: dict, column: str, feature: str, mode: str) -> float | None:
    """time(feature) / time(plain) - 1 on the same column and mode."""
    t, plain = feature_ms(data, column, feature, mode), feature_ms(data, column, "plain", mode)
    return None if t is None or plain is None else t / plain - 1.0


def feature_speed(data: dict, column: str, feature: str, peer: str, mode: str) -> float | None:
    """The peer's time over ours (> 1: ours is faster), both with `feature`."""
    t, p = feature_ms(data, column, feature, mode), feature_ms(data, peer, feature, mode)
    return None if t is None or p is None else p / t


def features_header(data: dict) -> str:
    v, p, sh, o = data["versions"], data["protocol"], data["shape"], data.get("options", {})
    opts = "; ".join(f"{k} {val}" for k, val in o.items())
    return (
        f"GPU {data['gpu']}, torch {v.get('torch')}, cuDNN {v.get('cudnn')}, strideattn "
        f"{v.get('strideattn')}; b {sh['b']}, h {sh['h']}, s {sh['s']}, d {sh['d']}, "
        f"{sh['dtype']}, {sh['mask']}; ms: median of {p.get('runs')} runs in {p.get('rounds')} "
        f"interleaved rounds after {p.get('warmup')} warm-ups each ({p.get('timer')}); "
        f"cost = time(feature) / time(plain) - 1, same backend and mode; options: {opts}"
    )


def _ms_cell(r: dict | None) -> str:
    if r is None:
        return "—"
    if r.get("status") != "ok":
        return r.get("status", "—")
    return "—" if r.get("ms") is None else f"{r['ms']:.3f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.1f}%"


def _met(ok: bool | None) -> str:
    return "—" if ok is None else ("yes" if ok else "NO")


def features_targets(data: dict) -> str:
    """Issue 19's targets as the data file states them, each against this run's numbers."""
    tg = data["targets"]
    be, mode, feats = tg["backend"], tg["mode"], data["features"]
    head = f"| target ({be}, {mode}) | measured | needed | met |"
    lines = [head, "| --- | --- | --- | --- |"]
    for feature, limit in tg["max_cost"].items():
        if feature in feats:
            c = feature_cost(data, be, feature, mode)
            ok = None if c is None else c <= limit
            lines.append(f"| {feature}: cost | {_pct(c)} | <= {_pct(limit)} | {_met(ok)} |")
    for feature, peer, need in tg["min_speed"]:
        if feature in feats:
            x = feature_speed(data, be, feature, peer, mode)
            ok = None if x is None else x >= need
            got = "—" if x is None else f"{x:.2f}x"
            lines.append(
                f"| {feature}: speed over {FEATURE_SDPA[peer]} with it | {got} | "
                f">= {need:.2f}x | {_met(ok)} |"
            )
    for feature, peer in tg["like_plain"]:
        if feature in feats:
            x = feature_speed(data, be, feature, peer, mode)
            plain = feature_speed(data, be, "plain", peer, mode)
            ok = None if x is None or plain is None else x >= plain
            got = "—" if x is None else f"{x:.2f}x"
            need = "—" if plain is None else f">= {plain:.2f}x (plain's)"
            lines.append(
                f"| {feature}: speed over {FEATURE_SDPA[peer]} with it | {got} | {need} | "
                f"{_met(ok)} |"
            )
    return "\n".join(lines)


def features_table(data: dict) -> str:
    """The tables bench/features.py prints: time and cost of each feature per backend and
    the SDPA columns; the targets; then what was refused, folded or failed its check."""
    backends = data["backends"]
    peers = [c for c in FEATURE_SDPA if any(r["column"] == c for r in data["rows"])]
    head = ["feature", "mode"]
    for be in backends:
        head += [f"{be} ms", f"{be} cost"]
    head += [f"{FEATURE_SDPA[c]} ms" for c in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for feature in data["features"]:
        for mode in FEATURE_MODES:
            cells = [feature, mode]
            for be in backends:
                r = feature_row(data, be, feature, mode)
                cost = "—" if feature == "plain" else _pct(feature_cost(data, be, feature, mode))
                cells += [_ms_cell(r), cost]
            cells += [_ms_cell(feature_row(data, c, feature, mode)) for c in peers]
            lines.append("| " + " | ".join(cells) + " |")
    out = "\n".join(lines) + "\n\n" + features_targets(data)
    notes: dict[tuple, list[str]] = {}
    for r in data["rows"]:
        said = []
        if r.get("status") != "ok":
            said.append(f"{r.get('status')}: {r.get('reason', '')}".rstrip(": "))
        if r.get("check") not in (None, "ok"):
            said.append(f"check failed: {r['check']}")
        if r.get("note"):
            said.append(r["note"])
        for text in said:
            notes.setdefault((r["column"], r["feature"], text), []).append(r["mode"])
    if notes:
        out += "\n\nNotes:\n" + "\n".join(
            f"- {col} {feat} ({', '.join(modes)}): {text}"
            for (col, feat, text), modes in sorted(notes.items())
        )
    return out


def features_files(results_dir: str) -> list[tuple[str, dict]]:
    """Every training-features data file in results_dir/features, oldest first."""
    files = []
    for p in glob.glob(os.path.join(results_dir, "features", "*.json")):
        with open(p) as f:
            data = json.load(f)
        if data.get("format") != FEATURES_FORMAT:
            raise ValueError(f"{p}: format {data.get('format')!r}, expected {FEATURES_FORMAT!r}")
        keys = ("date", "commit", "gpu", "command", "versions", "protocol", "shape", "backends")
        for key in keys + ("features", "targets", "rows"):
            if key not in data:
                raise ValueError(f"{p}: no {key!r}")
        files.append((p, data))
    return sorted(files, key=run_order)


def features_summary(results_dir: str) -> str:
    """The newest training-features run of each GPU."""
    newest: dict[str, tuple[str, dict]] = {}
    for path, data in features_files(results_dir):
        newest[data["gpu"]] = (path, data)
    if not newest:
        return "No training-features data in bench/results/features/ yet."
    parts = []
    for gpu in sorted(newest):
        path, data = newest[gpu]
        parts += [
            f"### {gpu}",
            f"- `{os.path.basename(path)}`: {data['date']}, commit {data['commit']}, "
            f"`{data['command']}`",
            "",
            features_header(data),
            "",
            features_table(data),
            "",
        ]
    return "\n".join(parts).rstrip("\n")


def _replace(text: str, begin: str, end: str, body: str) -> str:
    b, e = text.find(begin), text.find(end)
    if b < 0 or e < b:
        raise ValueError(f"bench/README.md lacks the markers {begin} ... {end}")
    return text[: b + len(begin)] + "\n" + body + "\n" + text[e:]


def render_readme(readme_text: str, results_dir: str) -> str:
    """readme_text with the sections between the markers replaced by the summaries (the
    host-time and training-features sections only where the README has their markers)."""
    text = _replace(readme_text, BEGIN, END, summary(results_dir))
    if HOST_BEGIN in text or HOST_END in text:
        text = _replace(text, HOST_BEGIN, HOST_END, host_summary(results_dir))
    if FEATURES_BEGIN in text or FEATURES_END in text:
        text = _replace(text, FEATURES_BEGIN, FEATURES_END, features_summary(results_dir))
    return text


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the README's summary differs from what the data renders",
    )
    ap.add_argument("--results", default=RESULTS, help="folder of data files")
    ap.add_argument("--readme", default=README)
    args = ap.parse_args()
    with open(args.readme) as f:
        current = f.read()
    rendered = render_readme(current, args.results)
    if args.check:
        if rendered != current:
            print(
                f"render: {args.readme} is out of date with {args.results}; "
                "run python3 bench/render.py",
                file=sys.stderr,
            )
            return 1
        return 0
    if rendered != current:
        with open(args.readme, "w") as f:
            f.write(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
