"""Per-shape table of an A/B log written by `scripts/gpu_check.sh ab`: one column
per benchmark run (labelled by its MLA_DECODE_EXP value, in run order), the mean
time of every competition shape and each format's geometric mean.
Usage: python3 scripts/ab_table.py ab.log"""
import re
import sys

ROW = re.compile(r"^(\w+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s")  # provider B KV H mean ...
GEO = re.compile(r"^\s+(\w+)\s+([\d.]+) us\s+floor")


def parse(path):
    runs = []  # (label, {key: us})
    in_summary = False
    for line in open(path):
        if line.startswith("## MLA_DECODE_EXP="):
            runs.append((line.split("=", 1)[1].split()[0], {}))
            in_summary = False
            continue
        if not runs:
            continue
        if line.startswith("competition H=16 geomean"):
            in_summary = True
            continue
        table = runs[-1][1]
        m = GEO.match(line)
        if in_summary and m:
            table[(m.group(1), "geomean")] = float(m.group(2))
            continue
        m = ROW.match(line)
        if m and not in_summary:
            table[(m.group(1), f"B{m.group(2)}/kv{m.group(3)}")] = float(m.group(5))
    return runs


def main():
    runs = parse(sys.argv[1])
    if not runs:
        print("ab_table: no '## MLA_DECODE_EXP=' runs in", sys.argv[1])
        return 1
    keys = []
    for _, table in runs:
        keys += [k for k in table if k not in keys]
    keys.sort(key=lambda k: (k[0], k[1] == "geomean"))
    print(f"{'format':8} {'shape':14} " + " ".join(f"{'exp=' + label:>10}" for label, _ in runs))
    for k in keys:
        cells = [f"{table[k]:10.2f}" if k in table else f"{'-':>10}" for _, table in runs]
        print(f"{k[0]:8} {k[1]:14} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
