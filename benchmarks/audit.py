"""Benchmark of `oma audit` at 10^6 and 10^7 rows, Parquet and JSONL: wall time, CPU time and peak memory.

    .venv/bin/python benchmarks/audit.py --before d20cfd7 --out benchmarks/audit.md   # the page: ~25 min
    .venv/bin/python benchmarks/audit.py --rows 100000 --repeat 1                      # a quick look

The batch imitates an ALFWorld-like stepwise rollout: groups of 8 trajectories of one task, ≈20 rows per
trajectory, a per-task difficulty, failures that often run to the 50-step cap and successes that finish
early (expansion–outcome coupling), lognormal tokens per response. It is written as

* `oma`: the trainer's format (int ids, `step`, `score`, `response_tokens`, `won`), as `write_batch` writes it;
* `verl-agent`: a verl-agent dump as docs/audit.md#verl-agent-batches writes it (uuid strings `uid` and
  `traj_uid`, `episode_rewards`, `is_action_valid`, `response_tokens`, the `row_id` numbering, padding copies
  appended as `adjust_batch` does), read with `--from verl-agent`;
* `verl-agent, sha1 row_hash`: the same with a 40-character `row_hash` text instead of `row_id` (Parquet);
* `oma + response_mask L`: the trainer's format with a padded boolean `response_mask` of width L instead of
  the counts (Parquet, the smallest size only): the peak grows by the mask, not in proportion to it.

Each figure is a fresh `python -m oma.cli audit FILE ... --json OUT --quiet` process with this checkout's
`src` first on the path (`--before REV`: also REV's, extracted with `git archive`), torch import included.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from throughput import publish

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GOAL = "10^7 rows in ≤ 30 s wall and ≤ 2 GB peak memory (issue #58)"


def make_batch(rows: int, seed: int = 0, group_size: int = 8, cap: int = 50) -> dict[str, np.ndarray]:
    """Trajectories until ``rows`` rows: ids, per-row score, tokens, step, won (numpy, vectorised)."""
    rng = np.random.default_rng(seed)
    n_traj = int(rows / 20 * 1.15) + group_size
    n_traj -= n_traj % group_size
    groups = n_traj // group_size
    difficulty = rng.beta(2.0, 2.0, size=groups)  # per-task success probability
    won = rng.random(n_traj) < np.repeat(difficulty, group_size)
    k_success = np.clip(rng.negative_binomial(4, 0.3, n_traj) + 3, 3, cap)  # finish early: mean ≈ 12
    at_cap = rng.random(n_traj) < 0.25
    k_fail = np.where(at_cap, cap, rng.integers(5, 40, n_traj))  # run to the cap, or give up: mean ≈ 29
    k = np.where(won, k_success, k_fail)
    last = np.searchsorted(np.cumsum(k), rows)  # keep whole groups up to `rows` rows
    keep_traj = ((last // group_size) + 1) * group_size
    k, won = k[:keep_traj], won[:keep_traj]
    traj = np.repeat(np.arange(keep_traj), k)[:rows]
    n = traj.shape[0]
    starts = np.cumsum(k) - k
    step = np.arange(n) - starts[traj]
    tokens = np.clip(rng.lognormal(3.4, 0.6, n).astype(np.int64), 1, 128)
    return {
        "group_id": traj // group_size,
        "traj_id": traj,
        "step": step,
        "score": np.where(won[traj], 10.0, 0.0),
        "response_tokens": tokens,
        "won": won[traj],
    }


def verl_agent_dump(b: dict[str, np.ndarray], seed: int = 1, divisor: int = 256) -> dict[str, pa.Array]:
    """The batch as verl-agent trains on it and docs/audit.md dumps it: uuid ids, the invalid actions, the rows
    numbered before ``adjust_batch`` appends copies of random rows up to a multiple of ``divisor``."""
    rng = np.random.default_rng(seed)
    rows = b["traj_id"].shape[0]
    picked = rng.choice(rows, size=(divisor - rows % divisor) % divisor, replace=False)
    order = np.concatenate([np.arange(rows), picked])
    groups = pa.array([str(uuid.UUID(int=int(x) + 1)) for x in range(int(b["group_id"].max()) + 1)])
    trajs = pa.array([str(uuid.UUID(int=(1 << 64) + int(x))) for x in range(int(b["traj_id"].max()) + 1)])
    return {
        "uid": groups.take(pa.array(b["group_id"][order])),
        "traj_uid": trajs.take(pa.array(b["traj_id"][order])),
        "episode_rewards": pa.array(b["score"][order]),
        "is_action_valid": pa.array((rng.random(rows) > 0.1)[order]),
        "response_tokens": pa.array(b["response_tokens"][order]),
        "row_id": pa.array(order),
    }


def sha1_like(row_id: np.ndarray, seed: int = 2) -> pa.Array:
    """A 40-character hex text per row id, the same for a copy as for its original (as a hash of input_ids)."""
    hex_pairs = np.array([f"{i:02x}".encode() for i in range(256)], dtype="S2")
    digests = hex_pairs[np.random.default_rng(seed).integers(0, 256, (int(row_id.max()) + 1, 20), dtype=np.uint8)]
    return pa.array(np.ascontiguousarray(digests).view("S40").ravel()[row_id]).cast(pa.string())


def write_jsonl(table: pa.Table, path: Path, chunk: int = 500_000) -> None:
    """One JSON object per row, written a chunk of rows at a time (pandas' C writer)."""
    with path.open("w", encoding="utf-8") as fh:
        for start in range(0, table.num_rows, chunk):
            text = table.slice(start, chunk).to_pandas().to_json(orient="records", lines=True)
            fh.write(text if text.endswith("\n") else text + "\n")


def write_files(folder: Path, rows: int, with_masks: bool) -> list[tuple[str, str, Path, list[str]]]:
    """(input, format, file, extra arguments) of every case at ``rows`` rows."""
    b = make_batch(rows)
    own = pa.table(b)
    va = pa.table(verl_agent_dump(b))
    cases = []
    for name, table, args in (("oma", own, []), ("verl-agent", va, ["--from", "verl-agent"])):
        path = folder / f"{name}_{rows}.parquet"
        pq.write_table(table, path)
        cases.append((name, "Parquet", path, args))
        path = folder / f"{name}_{rows}.jsonl"
        write_jsonl(table, path)
        cases.append((name, "JSONL", path, args))
    path = folder / f"sha1_{rows}.parquet"
    pq.write_table(va.drop_columns(["row_id"]).append_column("row_hash", sha1_like(np.asarray(va["row_id"]))), path)
    cases.append(("verl-agent, sha1 row_hash", "Parquet", path, ["--from", "verl-agent"]))
    if with_masks:
        for width in (128, 1024):
            n = b["response_tokens"]
            flags = (np.arange(width)[None, :] < n[:, None]).ravel()
            mask = pa.FixedSizeListArray.from_arrays(pa.array(flags), width).cast(pa.list_(pa.bool_()))
            path = folder / f"mask{width}_{rows}.parquet"
            pq.write_table(own.drop_columns(["response_tokens"]).append_column("response_mask", mask), path)
            cases.append((f"oma + response_mask L={width}", "Parquet", path, []))
    return cases


def timed(cmd: list[str], src: Path) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds user+sys, peak RSS MiB) of one fresh process (`/usr/bin/time -v`)."""
    env = dict(os.environ, PYTHONPATH=str(src))
    t0 = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stderr[-3000:]}")
    info = {k.strip(): v.strip() for k, _, v in (line.partition(": ") for line in out.stderr.splitlines())}
    cpu = float(info["User time (seconds)"]) + float(info["System time (seconds)"])
    return wall, cpu, int(info["Maximum resident set size (kbytes)"]) / 1024


def checkout(rev: str, folder: Path) -> Path:
    """``rev``'s ``src`` folder, extracted into ``folder``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder / "src"


def load_average() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def busy_cpu_seconds() -> float:
    """CPU seconds every process on the machine has spent busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this script and the audits it ran."""
    own = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(r.ru_utime + r.ru_stime for r in own)


def measure(cases, sources: dict[str, Path], repeat: dict[str, int], out: Path) -> list[dict]:
    results = []
    for name, fmt, path, args in cases:
        row = {"input": name, "format": fmt, "mib": path.stat().st_size / 2**20}
        for label, src in sources.items():
            runs = [timed([sys.executable, "-m", "oma.cli", "audit", str(path), *args, "--json", str(out), "--quiet"],
                          src) for _ in range(repeat[label])]
            row[label] = (min(w for w, _, _ in runs), sorted(c for _, c, _ in runs)[len(runs) // 2],
                          max(m for _, _, m in runs), len(runs))
            print(f"{path.name:<28} {label:<6} best {row[label][0]:6.2f} s  cpu {row[label][1]:6.2f} s  "
                  f"peak {row[label][2]:6.0f} MiB  (load {load_average()})", flush=True)
        results.append(row)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--repeat", type=int, default=3, help="runs per case with this checkout (best wall time)")
    ap.add_argument("--before", metavar="REV", help="also time REV's audit, one run per case")
    ap.add_argument("--out", default=None, help="write the Markdown page here")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="oma-audit-bench-"))
    sources = {"after": ROOT / "src"}
    repeat = {"after": args.repeat, "before": 1}
    loads = [load_average()]
    busy0, own0, t_start = busy_cpu_seconds(), own_cpu_seconds(), time.perf_counter()
    tables = []
    try:
        if args.before:
            sources = {"before": checkout(args.before, folder), **sources}
        for rows in args.rows:
            t0 = time.perf_counter()
            cases = write_files(folder, rows, with_masks=rows == min(args.rows))
            print(f"{rows} rows: files written in {time.perf_counter() - t0:.0f} s", flush=True)
            results = measure(cases, sources, repeat, folder / "out.json")
            summary = json.loads((folder / "out.json").read_text())
            tables.append((rows, results, summary))
            for _, _, path, _ in cases:
                path.unlink()
            loads.append(load_average())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    others = (busy_cpu_seconds() - busy0 - (own_cpu_seconds() - own0)) / (time.perf_counter() - t_start)
    command = "python benchmarks/audit.py"
    command += "" if args.rows == [1_000_000, 10_000_000] else " --rows " + " ".join(map(str, args.rows))
    command += "" if args.repeat == 3 else f" --repeat {args.repeat}"
    command += f" --before {args.before}" if args.before else ""
    command += " --out benchmarks/audit.md"
    lines = [
        "# Benchmark: `oma audit` at 10^6 and 10^7 rows",
        "",
        "```bash",
        f".venv/bin/{command}",
        "```",
        "",
        f"Goal: {GOAL}. Machine: {platform.machine()}, {os.cpu_count()} CPU cores visible, shared with other "
        f"jobs; Python {platform.python_version()}, {platform.system()}. Load average (1/5/15 min) at the start "
        f"and after each size: {'; '.join(loads)}. Each figure is a fresh `python -m oma.cli audit FILE --json OUT "
        "--quiet` process, torch import included: wall time the best of "
        f"{args.repeat} runs (after) or of 1 run (before, {args.before or '—'}), CPU time (user + sys, "
        "the median) and peak memory (maximum resident set size, `/usr/bin/time -v`), which the load does not "
        "change. On a loaded machine the wall time is up to CPU time × load / cores. Other processes kept "
        f"{max(others, 0):.1f} of the {os.cpu_count()} cores busy on average while this page was measured "
        "(/proc/stat's busy time less this script's and its audits').",
        "",
    ]
    for rows, results, s in tables:
        lines += [
            f"## {rows:,} rows",
            "",
            f"{s['rows']} rows in the last file, {s['trajectories']} trajectories, {s['groups']} groups; "
            f"{s['rows_per_traj_mean']:.1f} rows per trajectory (the issue's verl-agent dump had 297k trajectories "
            "at 10^7 rows, ≈34 rows each: fewer trajectories and groups than here).",
            "",
            "| input | format | file MiB | before: wall s | before: peak MiB | after: best wall s | after: CPU s | "
            "after: peak MiB |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in results:
            before = r.get("before")
            b_wall, b_peak = (f"{before[0]:.1f}", f"{before[2]:.0f}") if before else ("—", "—")
            a = r["after"]
            lines.append(f"| {r['input']} | {r['format']} | {r['mib']:.1f} | {b_wall} | {b_peak} | {a[0]:.1f} | "
                         f"{a[1]:.1f} | {a[2]:.0f} |")
        lines.append("")
    lines += [
        "What changed (issue #58 item 13): only the columns the audit reads are read; text ids arrive "
        "dictionary-encoded (an int32 per row, not a string); Arrow's freed buffers go back to the system before "
        "the audit allocates its own; the audit keeps one accounting's advantages and pushes at a time and shares "
        "read-only inputs instead of copying them; masks are counted a slice at a time from their bitmaps; padding "
        "copies come from a 64-bit hash of the row identity, computed without a Python object per row.",
        "",
    ]
    publish("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
