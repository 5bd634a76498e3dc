"""Same-run A/B of kernel variants (issue 4): main against patched copies, interleaved on one GPU.

Here (needs nvcc, no GPU), once per variant: a copy of HEAD with the patches applied and its
cubins built, under .ab/<name>/ (git-ignored: name `.ab` in the device tool's `carry`):

    python benchmarks/ab.py prepare NAME docs/experiments/NAME.patch
    python benchmarks/ab.py pack     # optional: every prepared tree into .ab/variants.tar.xz

The device tool carries at most 64 MiB (the checkout, .gpu-wheels and .ab together) and each
tree holds a ~12 MB cubin: `pack` compresses them ~8x (one xz archive; `run` unpacks it there).

On the H200 (after `source .gpu-wheels/activate.sh`), main (this checkout) and each variant in
turn, `--rounds` times, with `bench_mla.py --quick --no-flashinfer --no-flashmla
--assume-ceilings`; then a table of the medians per shape and the ratio variant / main (< 1: the
variant is faster), and one of each tree's SM clock and power per shape. `--long` drops
`--quick`: up to ~1 s of replays per shape (1,000 at most: 0.15-0.5 s for the 150-500 µs rows),
so the big rows run at the 700 W cap as in the benchmark (quick runs price cycles; a change that
saves energy shows only there, perf-notes Session 51).
`--suite` first runs the GPU test suite on each variant (a variant that fails is reported and
not timed):

    python3 benchmarks/ab.py run --shapes 0,4,8,9 --rounds 2 [--suite] NAME

Two runs of the same code on one instance agree to ~0.5%; runs on different instances do not
compare (the card's clocks and the host differ): only same-run ratios mean something.

Phase traces of trees prepared with a trace probe (e.g. docs/experiments/probe-trace-8.patch,
with and without the patch under study), on the H200:

    python3 benchmarks/ab.py trace --shapes 128,2,16,4096 64,1,16,8192 --runs 3 NAME...

runs benchmarks/trace_phases.py in each tree, prints one line per run (when the CTAs were
planned, their attention ends, the last done) and packs every run's text and JSON into
$OUT/traces.tgz (the device tool returns 8 files at most, named without commas).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AB_DIR = ROOT / ".ab"
SUITE = ["tests/test_bad_values_gpu.py", "tests/test_mla_gpu.py", "tests/test_engine_gpu.py",
         "tests/test_guard_bands_gpu.py", "tests/test_plan_cache_gpu.py"]


def prepare(name: str, patches: list[str]) -> Path:
    """.ab/<name>/: HEAD's tracked files, the patches applied (patch -p1), cubins built."""
    dest = AB_DIR / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True)
    subprocess.run(["tar", "x", "-C", str(dest)], input=archive.stdout, check=True)
    for patch in patches:
        with open(Path(patch).resolve(), "rb") as f:
            subprocess.run(["patch", "-p1", "--quiet"], cwd=dest, stdin=f, check=True)
    env = dict(os.environ, PYTHONPATH=str(dest))
    subprocess.run([sys.executable, "-m", "jit_mla", "build", "--cubins"], cwd=dest, env=env, check=True)
    for unused in ("benchmarks/results", "docs"):  # not run; only weight in the device tool's carry
        shutil.rmtree(dest / unused, ignore_errors=True)
    return dest


ARCHIVE = "variants.tar.xz"


def pack() -> Path:
    """Every prepared tree under .ab/ into .ab/variants.tar.xz (the trees removed). Trees packed
    before and not prepared again since stay in it (a tree prepared again replaces its copy)."""
    archive = AB_DIR / ARCHIVE
    if archive.is_file():
        with tempfile.TemporaryDirectory(dir=AB_DIR) as old:
            subprocess.run(["tar", "xJf", str(archive)], cwd=old, check=True)
            for tree in Path(old).iterdir():
                if not (AB_DIR / tree.name).exists():
                    tree.rename(AB_DIR / tree.name)
    names = sorted(d.name for d in AB_DIR.iterdir() if d.is_dir()) if AB_DIR.is_dir() else []
    if not names:
        raise SystemExit(f"no prepared variants under {AB_DIR}: `python benchmarks/ab.py prepare NAME PATCH` first")
    subprocess.run(["tar", "cJf", str(archive), *names], cwd=AB_DIR, check=True)
    for name in names:
        shutil.rmtree(AB_DIR / name)
    return archive


def unpack_if_packed(variants: list[str]) -> None:
    """Unpack .ab/variants.tar.xz when a named variant's tree is not there (the device host)."""
    archive = AB_DIR / ARCHIVE
    if archive.is_file() and any(not (AB_DIR / v).is_dir() for v in variants):
        subprocess.run(["tar", "xJf", str(archive)], cwd=AB_DIR, check=True)


def require_prepared(name: str, tree: Path) -> Path:
    """tree, when it holds built cubins (a prepared variant, or the checkout); else exits saying how."""
    if not (tree / "cubins").is_dir():
        raise SystemExit(f"{tree} is not a prepared variant: run `python benchmarks/ab.py prepare {name} ...` here")
    return tree


def _env(tree: Path, cache: str) -> dict:
    """The variant's package first on the path (activate.sh puts the main checkout there)."""
    site = os.environ.get("JIT_MLA_AB_SITE", "/tmp/site")
    return dict(os.environ, PYTHONPATH=f"{site}:{tree}", JIT_MLA_CACHE_DIR=cache)


def bench_once(tree: Path, cache: str, shapes: str, out_dir: str, replan: bool = False,
               long: bool = False) -> tuple[dict[str, float], dict[str, str]]:
    """µs per shape name of one benchmark run of `tree` (`replan`: bench_mla.py --replan, every
    call on other lengths than the one before it; its names end in " replan"; `long`: without
    --quick, up to ~1 s of replays per shape, the card at its power-limited clock), and per shape the
    SM clock and power nvidia-smi sampled while it ran ("MHz / W", "?" with too few samples)."""
    cmd = [sys.executable, "benchmarks/bench_mla.py", "--no-flashinfer", "--no-flashmla", "--assume-ceilings",
           "--out-dir", out_dir] + ([] if long else ["--quick"])
    if shapes:
        cmd += ["--shapes", shapes]
    if replan:
        cmd += ["--replan"]
    subprocess.run(cmd, cwd=tree, env=_env(tree, cache), check=True, stdout=subprocess.DEVNULL)
    (result,) = Path(out_dir).glob("*.json")
    suffix = " replan" if replan else ""
    rows = json.loads(result.read_text())["rows"]
    return ({row["name"] + suffix: row["ours"]["us"] for row in rows},
            {row["name"] + suffix: clock_cell(row["ours"]) for row in rows})


def clock_cell(ours: dict) -> str:
    """'MHz / W' of one timed row (smi_sampler's window medians), '?' without samples."""
    if not ours.get("clock_samples"):
        return "?"
    return f"{ours['sm_mhz']:.0f} / {ours['power_w']:.0f} ({ours['clock_samples']})"


def summarize(times: dict[str, list[dict[str, float]]]) -> list[str]:
    """Table lines: per shape the median µs of each variant and its ratio to the first (main)."""
    names = list(times)
    shapes = [s for s in times[names[0]][0]] if times[names[0]] else []
    med = {v: {s: statistics.median(run[s] for run in times[v]) for s in shapes} for v in names}
    head = "| shape | " + " | ".join(f"{v} µs" for v in names) + " | " + " | ".join(
        f"{v} / {names[0]}" for v in names[1:]) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(names) - 1)]
    for s in shapes:
        cells = [f"{med[v][s]:.1f}" for v in names] + [f"{med[v][s] / med[names[0]][s]:.3f}" for v in names[1:]]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return lines


def run(variants: list[str], shapes: str, rounds: int, suite: bool, replan: bool = False,
        long: bool = False) -> None:
    unpack_if_packed(variants)
    trees = {"main": ROOT, **{v: AB_DIR / v for v in variants}}
    for v, tree in trees.items():
        require_prepared(v, tree)
    if suite:
        for v, tree in list(trees.items()):
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", *SUITE], cwd=tree,
                               env=_env(tree, f"/tmp/ab_cache_{v}"), capture_output=True, text=True)
            tail = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
            print(f"suite {v}: {tail}", flush=True)
            if r.returncode != 0 and v != "main":
                del trees[v]
    times: dict[str, list[dict[str, float]]] = {v: [] for v in trees}
    clocks: dict[str, dict[str, str]] = {v: {} for v in trees}  # the last round's, per shape
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            # Odd rounds run the trees in reverse: the first run of a round sits in other clock
            # and cache states (small shapes read ~1.5% slower there), so no tree always gets it.
            order = list(trees.items())
            for v, tree in order[::-1] if i % 2 else order:
                row, clocks[v] = bench_once(tree, f"/tmp/ab_cache_{v}", shapes, f"{tmp}/{v}_{i}", long=long)
                if replan:
                    more, more_clocks = bench_once(tree, f"/tmp/ab_cache_{v}", shapes, f"{tmp}/{v}_{i}_replan",
                                                   replan=True, long=long)
                    row |= more
                    clocks[v] |= more_clocks
                times[v].append(row)
                print(f"round {i + 1} {v}: done", flush=True)
            # Each round's table as it ends: a run cut short by its time limit still reports.
            print(f"after round {i + 1}:", "\n".join(summarize(times)), sep="\n", flush=True)
            # Ratios compare kernels only at equal clocks: the power limit moves the clock with what
            # a kernel draws (e.g. a probe that loads nothing), and that is part of its time.
            print(f"round {i + 1} SM MHz / W (samples):", "\n".join(clock_table(clocks)), sep="\n", flush=True)


def clock_table(clocks: dict[str, dict[str, str]]) -> list[str]:
    """Per shape each tree's 'MHz / W (samples)' of its latest run."""
    names = list(clocks)
    shapes = list(clocks[names[0]])
    lines = ["| shape | " + " | ".join(names) + " |", "|" + "---|" * (1 + len(names))]
    lines += [f"| {s} | " + " | ".join(clocks[v].get(s, "?") for v in names) + " |" for s in shapes]
    return lines


def trace_line(name: str, summary: dict) -> str:
    """One run's trace summary (trace_phases.summarize) in a line: µs from the first entry."""
    e = summary["attention ends"]
    return (f"{name}: planned {summary['planned at']:.2f}, attention median {summary['attention']['median']:.1f}"
            f" / max {summary['attention']['max']:.1f}, ends 10/50/90/100% {e['p10']:.1f} / {e['p50']:.1f} /"
            f" {e['p90']:.1f} / {e['max']:.1f} ({e['ctas']} CTAs), last done {summary['first entry to last done']:.1f}")


def trace(variants: list[str], shapes: list[str], runs: int, out_dir: Path) -> Path:
    """On the GPU: trace_phases.py `runs` times per shape in each variant's tree; the runs' text
    and JSON under out_dir/traces/ (named VARIANT-BxQxHxKV-RUN), packed into out_dir/traces.tgz."""
    unpack_if_packed(variants)
    dest = out_dir / "traces"
    dest.mkdir(parents=True, exist_ok=True)
    for v in variants:
        tree = require_prepared(v, AB_DIR / v)
        for shape in shapes:
            for i in range(1, runs + 1):
                stem = dest / f"{v}-{shape.replace(',', 'x')}-{i}"
                r = subprocess.run([sys.executable, "benchmarks/trace_phases.py", "--shape", shape, "--json",
                                    f"{stem}.json"], cwd=tree, env=_env(tree, f"/tmp/ab_cache_{v}"),
                                   capture_output=True, text=True)
                stem.with_suffix(".txt").write_text(r.stdout + r.stderr)
                if r.returncode != 0:
                    print(f"{stem.name}: failed (rc {r.returncode}; its .txt)", flush=True)
                    continue
                summary = json.loads(stem.with_suffix(".json").read_text())["summary"]
                print(trace_line(stem.name, summary) if summary.get("ctas") else
                      f"{stem.name}: no phase marks (a probe without bit 3)", flush=True)
    archive = out_dir / "traces.tgz"
    subprocess.run(["tar", "czf", str(archive), "-C", str(out_dir), "traces"], check=True)
    return archive


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="here: .ab/NAME = HEAD + patches, cubins built")
    p.add_argument("name")
    p.add_argument("patches", nargs="*")
    sub.add_parser("pack", help=f"here: every prepared tree into .ab/{ARCHIVE} (the device tool's 64 MiB)")
    r = sub.add_parser("run", help="on the GPU: main and the variants, interleaved")
    r.add_argument("variants", nargs="+")
    r.add_argument("--shapes", default="", help="bench_mla.py --shapes (default: all)")
    r.add_argument("--rounds", type=int, default=2)
    r.add_argument("--suite", action="store_true", help="GPU test suite on each variant first")
    r.add_argument("--replan", action="store_true",
                   help="also time each tree with bench_mla.py --replan (a call that cannot reuse a plan)")
    r.add_argument("--long", action="store_true",
                   help="bench_mla.py without --quick: up to ~1 s of replays per shape (1,000 at most), at the power-limited clock")
    t = sub.add_parser("trace", help="on the GPU: trace_phases.py in each (probe-built) variant's tree")
    t.add_argument("variants", nargs="+")
    t.add_argument("--shapes", nargs="+", default=["8,1,128,4096"], help="B,Q_LEN,H,KV_LEN each")
    t.add_argument("--runs", type=int, default=3)
    t.add_argument("--out", default=os.environ.get("OUT", "/tmp/ab_traces"), help="default: $OUT")
    args = ap.parse_args()
    if args.cmd == "trace":
        print(trace(args.variants, args.shapes, args.runs, Path(args.out)))
    elif args.cmd == "prepare":
        print(prepare(args.name, args.patches))
    elif args.cmd == "pack":
        archive = pack()
        print(f"{archive} ({archive.stat().st_size / 2**20:.1f} MiB)")
    else:
        run(args.variants, args.shapes, args.rounds, args.suite, args.replan, args.long)


if __name__ == "__main__":
    main()
