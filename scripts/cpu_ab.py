"""A/B of the CPU kernel between git revisions, one core, interleaved: builds the checkout's
csrc/cpu/tools/piece_bench.cpp (the same harness and inputs for every revision) against each
revision's own kernel sources and headers (git archive of its csrc/), then runs the revisions in turn for every shape and round
and prints, per shape, each revision's minimum TSC ticks per key and group and its ratio to the
first revision. Only ratios within one run mean anything on a shared or frequency-scaling host.

    python scripts/cpu_ab.py main exp/my-branch --path amx \\
        --shapes "16,8192,fp8 16,8192,mxfp4 128,1024,bf16" --rounds 3 --core 9

A revision may be WORKTREE (the checkout's files as they are) or a directory that holds a csrc/
tree (a revision exported beforehand, for a machine whose copy of the checkout has no .git). Needs git, g++ and a CPU that runs
the chosen path (piece_bench refuses a path it cannot run, with the reason). Where the kernel
contract changed between the revisions (kernel_common.h), the checkout's harness may not compile
against the older one: --own-harness builds each revision with its own piece_bench.cpp.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "csrc" / "cpu" / "tools" / "piece_bench.cpp"
SOURCES = ["csrc/cpu/kernel_amx.cpp", "csrc/cpu/kernel_avx512.cpp", "csrc/cpu/kernel_avx2.cpp",
           "csrc/cpu/kernel_scalar.cpp", "csrc/cpu/cpu_features.cpp"]
LINE = re.compile(r" H=(\d+) keys=(\d+) .*?, ([\d.]+) per key and group")


def export(rev: str, dest: Path) -> Path:
    """The revision's csrc/ under dest (WORKTREE: the checkout's own folder; a directory with a csrc/:
    that directory)."""
    if rev == "WORKTREE":
        return ROOT
    if (Path(rev) / "csrc").is_dir():
        return Path(rev).resolve()
    dest.mkdir(parents=True)
    proc = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "csrc"], capture_output=True)
    if proc.returncode != 0:
        sys.exit(f"cpu_ab: git archive of revision {rev!r} failed: {proc.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=proc.stdout, check=True)
    return dest


def build(tree: Path, exe: Path, extra_flags, own_harness: bool = False) -> None:
    harness = tree / HARNESS.relative_to(ROOT) if own_harness else HARNESS
    # The revision's headers first; the checkout's after them, for the headers only its harness
    # includes (csrc/cpu/tools/synthetic.h, which older revisions lack).
    includes = [f"-I{tree / 'csrc'}"] + ([] if own_harness else [f"-I{ROOT / 'csrc'}"])
    cmd = ["g++", "-O3", "-std=c++17", *includes, *extra_flags, "-o", str(exe), str(harness),
           *[str(tree / s) for s in SOURCES]]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"cpu_ab: building piece_bench from {tree} failed:\n{proc.stderr[-3000:]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("revs", nargs="+", help="git revisions (or WORKTREE); the first is the baseline")
    ap.add_argument("--path", default="amx", help="amx, avx512, avx512_fp32, avx2 or scalar (default amx)")
    ap.add_argument("--shapes", default="16,8192,bf16 16,8192,fp8 16,8192,mxfp4 128,1024,bf16",
                    help="space-separated H,keys,format triples")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--core", type=int, default=None, help="pin every run to this core (taskset)")
    ap.add_argument("--rotate-mb", type=int, default=256, help="MB of cache rows each run rotates over")
    ap.add_argument("--cflags", default="", help="extra compiler flags, e.g. -DMLA_CPU_PROFILE")
    ap.add_argument("--own-harness", action="store_true",
                    help="build each revision with its own csrc/cpu/tools/piece_bench.cpp instead of the "
                         "checkout's (for revisions whose kernel contract the checkout's harness no longer "
                         "compiles against; the harness's inputs must be the same in both)")
    args = ap.parse_args(argv)
    shapes = []
    for s in args.shapes.split():
        parts = s.split(",")
        if len(parts) != 3:
            ap.error(f"--shapes: expected H,keys,format, got {s!r}")
        shapes.append(parts)
    with tempfile.TemporaryDirectory(prefix="cpu_ab_") as tmp:
        exes = []
        for i, rev in enumerate(args.revs):
            tree = export(rev, Path(tmp) / f"rev{i}")
            exe = Path(tmp) / f"piece_bench_{i}"
            build(tree, exe, args.cflags.split(), args.own_harness)
            exes.append(exe)
        pin = ["taskset", "-c", str(args.core)] if args.core is not None else []
        best = {}
        for h, keys, fmt in shapes:
            for r in range(args.rounds):
                for i, exe in enumerate(exes):
                    proc = subprocess.run([*pin, str(exe), args.path, fmt, h, keys, "0", str(args.rotate_mb)],
                                          capture_output=True, text=True)
                    if proc.returncode != 0:
                        sys.exit(f"cpu_ab: {args.revs[i]} {args.path} {fmt} H={h} keys={keys}: {proc.stderr.strip()}")
                    m = LINE.search(proc.stdout)
                    if not m:
                        sys.exit(f"cpu_ab: unexpected output: {proc.stdout!r}")
                    best.setdefault((h, keys, fmt), {}).setdefault(i, []).append(float(m.group(3)))
                    if proc.stderr.strip() and args.cflags:
                        print(f"  {args.revs[i]} H={h} keys={keys} {fmt}: {proc.stderr.strip()}")
        print(f"{args.path}: TSC ticks per key and group, min over {args.rounds} interleaved rounds "
              f"(all rounds in brackets); ratio to {args.revs[0]}")
        for (h, keys, fmt), d in best.items():
            base = min(d[0])
            cells = [f"{args.revs[i]} {min(t):.1f} ({' '.join(f'{x:.0f}' for x in t)}) x{min(t) / base:.2f}"
                     for i, t in sorted(d.items())]
            print(f"H={h:>3} keys={keys:>5} {fmt:>5}: " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
