"""Top warp-stall locations of one kernel from `ncu --page source --csv
--print-source sass` output: python3 scripts/ncu_stalls.py source.csv [N]."""
import collections
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
top_n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
hdr, data = None, []
for r in rows:
    if r and r[0] == "Kernel Name":
        if data:
            break  # the first kernel only
        continue
    if r and r[0] == "Address":
        hdr = r
        continue
    if hdr and r and len(r) == len(hdr):
        data.append(r)
H = {h: i for i, h in enumerate(hdr)}
samples = lambda r: int(r[H["Warp Stall Sampling (All Samples)"]] or 0)  # noqa: E731
total = sum(samples(r) for r in data)
execd = sum(int(r[H["Instructions Executed"]] or 0) for r in data)
stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
print(f"samples {total}, warp instructions executed {execd}")
agg = collections.Counter()
for r in data:
    for h in stalls:
        agg[h[6:]] += int(r[H[h]] or 0)
print("stall reasons:", ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in agg.most_common(10)))
for i, r in enumerate(data):
    r.append(i)
for r in sorted(data, key=lambda r: -samples(r))[:top_n]:
    reasons = sorted(((int(r[H[h]] or 0), h[6:]) for h in stalls), reverse=True)[:2]
    print(f"{r[-1]:5d} {100 * samples(r) / total:5.1f}% exec {r[H['Instructions Executed']]:>9} "
          f"{r[1][:58]:58s} {reasons}")
