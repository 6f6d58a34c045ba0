#!/usr/bin/env python3
"""Per-kernel resource table and checks for AMDGPU assembly (.s) files.

Used by scripts/hip_check.sh:

    python3 scripts/hip_asm_report.py --scratch-budget 0 ARCH:FILE.s [ARCH:FILE.s ...]

Reads, for every kernel in each file's AMDGPU metadata (.amdgpu_metadata), the
VGPR / AGPR / SGPR counts, the private segment (scratch) size, the group
segment (LDS) size, spill counts and dynamic-stack flag; counts the v_mfma
instructions (all, and the fp8 ones, v_mfma_*_fp8_fp8, separately) and calls
(s_swappc) in the kernel's body; prints one table row per kernel. Exits 1 unless
  * every file compiled for an arch holds, together, the 4 split-KV decode
    kernels (bf16, fp8 e4m3fn, fp8 e4m3fnuz, MXFP4) and the combine kernel,
  * every decode kernel contains MFMA instructions,
  * the fp8 decode kernels use fp8 MFMA (and no other MFMA) where the target
    has it for that format (FP8_MFMA below: gfx942 both e4m3 flavours,
    gfx950 OCP e4m3fn), and no other kernel contains fp8 MFMA,
  * every kernel's scratch is within the budget, it uses no dynamic stack and
    makes no calls (a call would mean an un-inlined device-library function
    whose stack is unknown),
  * every kernel's LDS fits the 64 KB a CDNA workgroup may address.
"""
import argparse
import re
import sys
from collections import defaultdict

FORMATS = {"0": "bf16", "1": "fp8_e4m3fn", "2": "fp8_e4m3fnuz", "3": "mxfp4"}
LDS_LIMIT = 64 * 1024
# Decode kernels that must run on fp8 MFMA, per arch (kernels/cdna/mfma_kernel.cuh,
# Fmt<F>::kFp8Mfma).
FP8_MFMA = {"gfx942": {"fp8_e4m3fn", "fp8_e4m3fnuz"}, "gfx950": {"fp8_e4m3fn"}}


def short_name(mangled):
    m = re.search(r"mla_decode_split_kernel_mfmaILNS_8KvFormatE(\d)EE", mangled)
    if m:
        return f"split_kernel_mfma<{FORMATS.get(m.group(1), m.group(1))}>"
    if "combine_kernel" in mangled:
        return "combine_kernel"
    return mangled


def parse_metadata(text):
    m = re.search(r"^\s*\.amdgpu_metadata\s*$(.*?)^\s*\.end_amdgpu_metadata", text, re.S | re.M)
    if not m:
        return []
    block = m.group(1)
    kern = re.search(r"^amdhsa\.kernels:\s*$(.*?)(?=^amdhsa\.|\Z)", block, re.S | re.M)
    if not kern:
        return []
    kernels, cur = [], None
    for line in kern.group(1).splitlines():
        start = re.match(r"^  - (.*)$", line)
        if start:
            cur = {}
            kernels.append(cur)
            line = "    " + start.group(1)
        kv = re.match(r"^    \.([A-Za-z_]+):\s*(.*)$", line)
        if kv and cur is not None:
            cur[kv.group(1)] = kv.group(2).strip()
    return kernels


def body_stats(text, symbol):
    start = re.search(r"^" + re.escape(symbol) + r":", text, re.M)
    if not start:
        return None
    end = re.search(r"^\.Lfunc_end\d+:", text[start.end():], re.M)
    body = text[start.end(): start.end() + (end.start() if end else len(text))]
    tail = text[start.end() + (end.start() if end else 0):]
    occ = re.search(r";\s*Occupancy:\s*(\d+)", tail)
    return {
        "mfma": len(re.findall(r"^\s+v_mfma", body, re.M)),
        "mfma_fp8": len(re.findall(r"^\s+v_mfma_\w*_fp8_fp8\b", body, re.M)),
        "calls": len(re.findall(r"^\s+s_swappc_b64", body, re.M)),
        "occupancy": occ.group(1) if occ else "?",
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scratch-budget", type=int, default=0, help="max private segment bytes per kernel")
    ap.add_argument("files", nargs="+", help="ARCH:path.s")
    a = ap.parse_args()

    rows, errors = [], []
    seen = defaultdict(set)
    for spec in a.files:
        arch, path = spec.split(":", 1)
        text = open(path).read()
        kernels = parse_metadata(text)
        if not kernels:
            errors.append(f"{arch} {path}: no kernels in the AMDGPU metadata")
        for k in kernels:
            sym = k.get(".symbol", k.get("symbol", "")) or k.get("name", "")
            sym = k.get("symbol", sym).removesuffix(".kd")
            name = short_name(k.get("name", sym))
            st = body_stats(text, sym) or {"mfma": 0, "mfma_fp8": 0, "calls": 0, "occupancy": "?"}
            scratch = int(k.get("private_segment_fixed_size", "0"))
            lds = int(k.get("group_segment_fixed_size", "0"))
            dyn = k.get("uses_dynamic_stack", "false") == "true"
            row = dict(arch=arch, tu=path.rsplit("/", 1)[-1], kernel=name, vgpr=k.get("vgpr_count", "?"),
                       agpr=k.get("agpr_count", "0"), sgpr=k.get("sgpr_count", "?"), scratch=scratch, lds=lds,
                       vspill=k.get("vgpr_spill_count", "0"), sspill=k.get("sgpr_spill_count", "0"),
                       occ=st["occupancy"], mfma=st["mfma"], mfma_fp8=st["mfma_fp8"], calls=st["calls"])
            rows.append(row)
            seen[arch].add(name)
            tag = f"{arch} {name}"
            if name.startswith("split_kernel_mfma") and st["mfma"] == 0:
                errors.append(f"{tag}: no v_mfma instruction in the decode kernel")
            fmt = name[len("split_kernel_mfma<"):-1] if name.startswith("split_kernel_mfma<") else None
            if fmt in FP8_MFMA.get(arch, set()):
                if st["mfma_fp8"] == 0 or st["mfma_fp8"] != st["mfma"]:
                    errors.append(f"{tag}: expected only fp8 MFMA, found {st['mfma_fp8']} fp8 of {st['mfma']} MFMA")
            elif st["mfma_fp8"]:
                errors.append(f"{tag}: unexpected fp8 MFMA ({st['mfma_fp8']})")
            if scratch > a.scratch_budget:
                errors.append(f"{tag}: scratch {scratch} B exceeds the budget of {a.scratch_budget} B")
            if dyn:
                errors.append(f"{tag}: uses a dynamic stack")
            if st["calls"]:
                errors.append(f"{tag}: makes {st['calls']} calls (a device function was not inlined)")
            if lds > LDS_LIMIT:
                errors.append(f"{tag}: LDS {lds} B exceeds {LDS_LIMIT} B")
    want = {f"split_kernel_mfma<{f}>" for f in FORMATS.values()} | {"combine_kernel"}
    for arch, names in seen.items():
        for missing in sorted(want - names):
            errors.append(f"{arch}: kernel {missing} was not compiled")

    hdr = ("arch", "kernel", "VGPR*", "AGPR", "SGPR", "scratch B", "LDS B", "spills v/s", "waves/SIMD", "mfma",
           "fp8 mfma", "calls")
    table = [hdr] + [(r["arch"], r["kernel"], r["vgpr"], r["agpr"], r["sgpr"], str(r["scratch"]), str(r["lds"]),
                      f"{r['vspill']}/{r['sspill']}", r["occ"], str(r["mfma"]), str(r["mfma_fp8"]), str(r["calls"]))
                     for r in rows]
    widths = [max(len(str(t[i])) for t in table) for i in range(len(hdr))]
    for i, t in enumerate(table):
        print("  " + "  ".join(str(c).ljust(w) if j < 2 else str(c).rjust(w) for j, (c, w) in enumerate(zip(t, widths))))
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))
    print(f"  (VGPR* = .vgpr_count, the unified VGPR+AGPR file per lane on gfx90a+; scratch budget {a.scratch_budget} B"
          f" per kernel; LDS limit {LDS_LIMIT} B; 'spills v/s': VGPR spills go"
          " to scratch, SGPR spills to VGPR lanes; 'mfma' counts every v_mfma, 'fp8 mfma' the v_mfma_*_fp8_fp8 among them)")
    if errors:
        for e in errors:
            print(f"hip_check: FAIL {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
