#!/usr/bin/env python3
"""Per-kernel resource table, instruction checks and main-loop instruction mix for
AMDGPU assembly (.s) files.

Used by scripts/hip_check.sh:

    python3 scripts/hip_asm_report.py --scratch-budget 0 ARCH:FILE.s [ARCH:FILE.s ...]

Reads, for every kernel in each file's AMDGPU metadata (.amdgpu_metadata), the
VGPR / AGPR / SGPR counts, the private segment (scratch) size, the group
segment (LDS) size, spill counts and dynamic-stack flag; lists the matrix
instructions (v_mfma*, with the A / B operand formats of the f8f6f4 forms) and
calls (s_swappc) in the kernel's body; prints one table row per kernel, then the
instruction mix of each decode kernel's main (KV stage) loop. Exits 1 unless
  * every file compiled for an arch holds, together, the 4 split-KV decode
    kernels (bf16, fp8 e4m3fn, fp8 e4m3fnuz, MXFP4) and the combine kernel,
  * each decode kernel contains exactly the matrix instructions intended for
    its arch and format (EXPECTED_MFMA below: every one of them, and no other
    v_mfma), plus the arch's other intended instructions (EXPECTED_OTHER), and
    the combine kernel none,
  * every kernel's scratch is within the budget, it uses no dynamic stack and
    makes no calls (a call would mean an un-inlined device-library function
    whose stack is unknown),
  * every kernel's LDS fits the 64 KB a CDNA workgroup may address.

With --predict, it also prints the MI355X time model of docs/amd.md ("Predicted
MI355X times") for the competition shapes and the H = 128 sweep, computed from
the gfx950 kernels' assembly (KV stage loop instruction mix, instructions
outside the loop, occupancy); nothing in it was measured on AMD hardware.
"""
import argparse
import math
import re
import sys
from collections import Counter, defaultdict

FORMATS = {"0": "bf16", "1": "fp8_e4m3fn", "2": "fp8_e4m3fnuz", "3": "mxfp4"}
LDS_LIMIT = 64 * 1024
F8F6F4 = {0: "e4m3", 1: "e5m2", 2: "e2m3", 3: "e3m2", 4: "e2m1"}  # CBSZ / BLGP codes (CDNA4 ISA 7.1.5)

# The matrix instructions each decode kernel must use, per arch and format
# (kernels/cdna/mfma_kernel.cuh for gfx90a / gfx942, mfma_gfx950.cuh for
# gfx950): every listed one must occur, and no other v_mfma.
SCALED_FP4 = "v_mfma_scale_f32_16x16x128_f8f6f4 A=e2m1 B=e4m3"
SCALED_FP8 = "v_mfma_scale_f32_16x16x128_f8f6f4 A=e4m3 B=e4m3"
EXPECTED_MFMA = {
    "gfx90a": {f: {"v_mfma_f32_16x16x16bf16_1k"} for f in FORMATS.values()},
    "gfx942": {
        "bf16": {"v_mfma_f32_16x16x16_bf16"},
        "fp8_e4m3fn": {"v_mfma_f32_16x16x32_fp8_fp8"},
        "fp8_e4m3fnuz": {"v_mfma_f32_16x16x32_fp8_fp8"},
        "mxfp4": {"v_mfma_f32_16x16x16_bf16"},
    },
    "gfx950": {
        "bf16": {"v_mfma_f32_16x16x32_bf16"},
        "fp8_e4m3fn": {SCALED_FP8, "v_mfma_f32_16x16x32_bf16"},
        "fp8_e4m3fnuz": {"v_mfma_f32_16x16x32_bf16"},
        "mxfp4": {SCALED_FP4, "v_mfma_f32_16x16x32_bf16"},
    },
}
# Other instructions a decode kernel must contain (V expanded to bf16 with its
# block scale by the convert; Q split by the fp8 convert).
EXPECTED_OTHER = {
    "gfx950": {
        "fp8_e4m3fn": {"v_cvt_scalef32_pk_bf16_fp8", "v_cvt_pk_fp8_f32"},
        "mxfp4": {"v_cvt_scalef32_pk_bf16_fp4", "v_cvt_pk_fp8_f32"},
    },
}


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


def mfma_key(line):
    """The instruction's mnemonic, with the operand formats of the f8f6f4 forms."""
    mn = line.split()[0]
    if mn.endswith("_f8f6f4"):
        cb = re.search(r"\bcbsz:(\d)", line)
        bl = re.search(r"\bblgp:(\d)", line)
        mn += f" A={F8F6F4[int(cb.group(1)) if cb else 0]} B={F8F6F4[int(bl.group(1)) if bl else 0]}"
    return mn


def kernel_body(text, symbol):
    start = re.search(r"^" + re.escape(symbol) + r":", text, re.M)
    if not start:
        return None, ""
    end = re.search(r"^\.Lfunc_end\d+:", text[start.end():], re.M)
    body = text[start.end(): start.end() + (end.start() if end else len(text))]
    tail = text[start.end() + (end.start() if end else 0):]
    return body, tail


def body_stats(body, tail):
    occ = re.search(r";\s*Occupancy:\s*(\d+)", tail)
    lines = [l.strip() for l in body.splitlines()]
    return {
        "mfma": Counter(mfma_key(l) for l in lines if l.startswith("v_mfma")),
        "ops": Counter(l.split()[0] for l in lines if re.match(r"[a-z]", l)),
        "calls": sum(1 for l in lines if l.startswith("s_swappc_b64")),
        "occupancy": occ.group(1) if occ else "?",
    }


def classify(mn):
    if mn.startswith("v_mfma"):
        return "mfma"
    if mn.startswith("ds_read") or mn.startswith("ds_bpermute") or mn.startswith("ds_permute"):
        return "lds_read"
    if mn.startswith("ds_write"):
        return "lds_write"
    if mn.startswith(("global_load", "buffer_load", "flat_load")):
        return "vmem_load"
    if mn.startswith(("global_store", "buffer_store", "flat_store")):
        return "vmem_store"
    if mn == "s_barrier":
        return "barrier"
    if mn.startswith("s_waitcnt"):
        return "waitcnt"
    if mn.startswith("v_"):
        return "valu"
    if mn.startswith("s_"):
        return "salu"
    return "other"


def lds_bytes(mn):
    """Bytes one lane moves through LDS with instruction mn (0 if not LDS)."""
    if not mn.startswith("ds_"):
        return 0
    if mn.startswith(("ds_bpermute", "ds_permute")):
        return 4
    m = re.match(r"ds_(?:read|write)(2(?:st64)?)?_(?:[bui])(\d+)", mn)
    if not m:
        return 4
    return int(m.group(2)) // 8 * (2 if m.group(1) else 1)


def main_loop_mix(body):
    """Static instruction counts of the decode kernel's KV stage loop: the
    depth-1 loop (the compiler's "Loop Header" / "in Loop: Header=" block
    annotations) that holds the most v_mfma. Blocks that a wave skips (a
    branch not taken by every lane) are counted too: an upper bound on what
    one iteration issues."""
    blocks, cur = [], None
    for line in body.splitlines():
        m = re.match(r"^(\.LBB\w+|; %bb\.\d+):\s*(;.*)?$", line)
        if m:
            cur = {"name": re.sub(r"^(\.L|; %)", "", m.group(1)), "comment": m.group(2) or "", "lines": []}
            blocks.append(cur)
            continue
        if cur is None:
            cur = {"name": "entry", "comment": "", "lines": []}
            blocks.append(cur)
        if re.match(r"^\s+[a-z]", line):
            cur["lines"].append(line.strip())
    best = None
    for h in [b["name"] for b in blocks if "Loop Header: Depth=1" in b["comment"]]:
        members = [b for b in blocks if b["name"] == h or re.search(r"Header=" + re.escape(h) + r"\b", b["comment"])]
        lines = [l for b in members for l in b["lines"]]
        n = sum(1 for l in lines if l.startswith("v_mfma"))
        if best is None or n > best[0]:
            best = (n, lines)
    if not best or best[0] == 0:
        return None
    lines = best[1]
    mix = Counter(classify(l.split()[0]) for l in lines)
    mfma = Counter(mfma_key(l) for l in lines if l.startswith("v_mfma"))
    cvt = Counter(l.split()[0] for l in lines if l.startswith(("v_cvt", "v_perm")))
    mix["lds_bytes"] = sum(lds_bytes(l.split()[0]) for l in lines)  # per lane
    every = sum(1 for b in blocks for _ in b["lines"])
    mix["outside"] = every - len(lines)  # instructions outside the loop: prologue, epilogue, slow paths
    return mix, mfma, cvt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scratch-budget", type=int, default=0, help="max private segment bytes per kernel")
    ap.add_argument("--predict", action="store_true", help="print the MI355X time model from the gfx950 kernels")
    ap.add_argument("files", nargs="+", help="ARCH:path.s")
    a = ap.parse_args()

    rows, errors, mixes = [], [], []
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
            body, tail = kernel_body(text, sym)
            st = body_stats(body or "", tail)
            scratch = int(k.get("private_segment_fixed_size", "0"))
            lds = int(k.get("group_segment_fixed_size", "0"))
            dyn = k.get("uses_dynamic_stack", "false") == "true"
            mfma_txt = ", ".join(f"{n} {m}" for m, n in sorted(st["mfma"].items())) or "-"
            rows.append(dict(arch=arch, kernel=name, vgpr=k.get("vgpr_count", "?"), agpr=k.get("agpr_count", "0"),
                             sgpr=k.get("sgpr_count", "?"), scratch=scratch, lds=lds,
                             vspill=k.get("vgpr_spill_count", "0"), sspill=k.get("sgpr_spill_count", "0"),
                             occ=st["occupancy"], calls=st["calls"], mfma=mfma_txt))
            seen[arch].add(name)
            tag = f"{arch} {name}"
            fmt = name[len("split_kernel_mfma<"):-1] if name.startswith("split_kernel_mfma<") else None
            if fmt is not None:
                want = EXPECTED_MFMA.get(arch, {}).get(fmt)
                got = set(st["mfma"])
                if want is None:
                    errors.append(f"{tag}: no intended instruction set for this arch (EXPECTED_MFMA)")
                else:
                    for m in sorted(want - got):
                        errors.append(f"{tag}: intended matrix instruction {m} is missing")
                    for m in sorted(got - want):
                        errors.append(f"{tag}: unexpected matrix instruction {m} ({st['mfma'][m]}x)")
                for op in sorted(EXPECTED_OTHER.get(arch, {}).get(fmt, set())):
                    if not st["ops"].get(op):
                        errors.append(f"{tag}: intended instruction {op} is missing")
                mix = main_loop_mix(body or "")
                if mix is None:
                    errors.append(f"{tag}: no KV stage loop with MFMA found")
                else:
                    mixes.append((arch, name, k.get("vgpr_count", "?"), st["occupancy"], lds) + mix)
            elif st["mfma"]:
                errors.append(f"{tag}: unexpected matrix instructions ({mfma_txt})")
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

    hdr = ("arch", "kernel", "VGPR*", "AGPR", "SGPR", "scratch B", "LDS B", "spills v/s", "waves/SIMD", "calls",
           "matrix instructions (static count)")
    table = [hdr] + [(r["arch"], r["kernel"], r["vgpr"], r["agpr"], r["sgpr"], str(r["scratch"]), str(r["lds"]),
                      f"{r['vspill']}/{r['sspill']}", r["occ"], str(r["calls"]), r["mfma"]) for r in rows]
    print_table(table, left=(0, 1, len(hdr) - 1))
    print(f"  (VGPR* = .vgpr_count, the unified VGPR+AGPR file per lane on gfx90a+; scratch budget {a.scratch_budget} B"
          f" per kernel; LDS limit {LDS_LIMIT} B; 'spills v/s': VGPR spills go to scratch, SGPR spills to VGPR lanes;"
          " f8f6f4 forms are listed with their A / B operand formats)")

    print("  KV stage loop of each decode kernel (32 keys x 16 heads per iteration; static counts per wave, every"
          " block of the loop counted once):")
    hdr = ("arch", "kernel", "VGPR*", "waves/SIMD", "LDS B", "MFMA", "VALU", "of which cvt / perm", "SALU",
           "LDS rd", "LDS wr", "LDS B/lane", "VMEM ld", "barriers", "waitcnt")
    table = [hdr]
    for arch, name, vgpr, occ, lds, mix, mfma, cvt in mixes:
        table.append((arch, name, vgpr, occ, str(lds), " + ".join(f"{n} {m.removeprefix('v_mfma_')}" for m, n in sorted(mfma.items())),
                      str(mix["valu"]), ", ".join(f"{n} {m}" for m, n in sorted(cvt.items())) or "-", str(mix["salu"]),
                      str(mix["lds_read"]), str(mix["lds_write"]), str(mix["lds_bytes"]), str(mix["vmem_load"]),
                      str(mix["barrier"]),
                      str(mix["waitcnt"])))
    print_table(table, left=(0, 1, 5, 7))
    if a.predict:
        predict({name: (int(occ), lds, mix, mfma) for arch, name, vgpr, occ, lds, mix, mfma, cvt in mixes
                 if arch == "gfx950" and occ != "?"})
    if errors:
        for e in errors:
            print(f"hip_check: FAIL {e}")
        return 1
    return 0


def print_table(table, left):
    widths = [max(len(str(t[i])) for t in table) for i in range(len(table[0]))]
    for i, t in enumerate(table):
        print("  " + "  ".join(str(c).ljust(w) if j in left else str(c).rjust(w)
                               for j, (c, w) in enumerate(zip(t, widths))))
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))


# ---- MI355X time model (docs/amd.md, "Predicted MI355X times") -----------------
# Machine (public figures) and the assumptions a first hardware run calibrates.
CUS = 256                 # MI355X compute units
CLOCK_HZ = 2.4e9          # peak engine clock (a loaded part may run lower)
HBM_BYTES_PER_S = 8e12    # HBM3E peak
LAUNCH_S = 3e-6           # per kernel launch under the competition protocol: ASSUMED (H200: 3.4 us one kernel)
DRAM_ROUND_TRIP_S = 1e-6  # one dependent global-memory round trip under load: ASSUMED
ISSUE_CYCLES = 4          # a wave issues at most one instruction per 4 cycles
LDS_BYTES_PER_CYCLE = 128  # per CU (CDNA3 / CDNA4 LDS bandwidth)
VALU_CYCLES = 4           # a wave64 VALU instruction on a 16-lane SIMD
# MFMA pipe cycles (CDNA4 ISA Table 28, 7.1.5): 16x16x32 bf16 16; 16x16x128
# f8f6f4 32 when either operand is fp8, else 16.
MFMA_CYCLES = {"v_mfma_f32_16x16x32_bf16": 16, SCALED_FP8: 32, SCALED_FP4: 32}
ROW_BYTES = {"bf16": 1152, "fp8_e4m3fn": 576, "mxfp4": 306}  # cache bytes per KV row (MXFP4: + 18 scales)
KEYS_PER_STAGE, HEADS_PER_WG, MAX_SPLITS_AMD, WGS_PER_CU_PLAN = 32, 16, 128, 2


def planned_splits(batch, heads, kv):
    """csrc/plan/plan.cpp split_count() for AMD (mfma_plan: 2 workgroups per CU,
    32-key tiles, 16 heads per workgroup, cap kMaxPlannedSplitsAmd = 128)."""
    tiles = batch * -(-heads // HEADS_PER_WG)
    max_tiles = max(1, kv // KEYS_PER_STAGE)
    splits = min((CUS * WGS_PER_CU_PLAN + tiles // 2) // tiles, max_tiles)
    return max(1, min(splits, MAX_SPLITS_AMD))


def predict_one(kern, fmt, batch, heads, kv):
    occ, lds, mix, mfma = kern
    groups = -(-heads // HEADS_PER_WG)
    splits = planned_splits(batch, heads, kv)
    chunk = -(-(-(-kv // splits)) // KEYS_PER_STAGE) * KEYS_PER_STAGE  # work.cuh: ceil(ceil(kv / S) / 32) * 32
    stages = -(-min(chunk, kv) // KEYS_PER_STAGE)  # of the longest split
    wgs = batch * groups * splits
    # Co-resident workgroups per CU: the compiler's waves/SIMD (VGPRs, LDS),
    # no more than the grid provides.
    k = max(1, min(occ, -(-wgs // CUS)))
    rounds = -(-wgs // (CUS * k))
    issued = sum(v for key, v in mix.items() if key not in ("outside", "lds_bytes"))
    mfma_cycles = sum(MFMA_CYCLES[m] * n for m, n in mfma.items())
    # One stage of one workgroup, per SIMD, with k waves sharing the SIMD:
    # the VALU pipe, the matrix pipe, or the per-wave issue limit (the other
    # waves' instructions co-issue).
    # The CU's LDS serves the workgroup's 4 waves: it bounds a stage too.
    lds_cycles = 4 * 64 * mix["lds_bytes"] / LDS_BYTES_PER_CYCLE
    stage_cycles = max(VALU_CYCLES * mix["valu"], mfma_cycles, ISSUE_CYCLES * issued / k, lds_cycles)
    fixed_s = 2 * DRAM_ROUND_TRIP_S + ISSUE_CYCLES * mix["outside"] / k / CLOCK_HZ  # Q + first tile; epilogue
    wg_s = fixed_s + stages * stage_cycles * k / CLOCK_HZ  # k workgroups advance together
    compute_s = rounds * wg_s
    kv_bytes = batch * kv * ROW_BYTES[fmt]
    partial_bytes = splits * batch * heads * (kHeadDimV * 4 + 4) if splits > 1 else 0
    mem_s = (kv_bytes + batch * heads * 1152 + partial_bytes) / HBM_BYTES_PER_S
    split_s = max(mem_s + fixed_s, compute_s)
    # The combine kernel reads the partials back (its own instructions are few).
    combine_s = LAUNCH_S + DRAM_ROUND_TRIP_S + partial_bytes / HBM_BYTES_PER_S if splits > 1 else 0.0
    total = LAUNCH_S + split_s + combine_s
    parts = {"launch": LAUNCH_S * (2 if splits > 1 else 1) + (DRAM_ROUND_TRIP_S if splits > 1 else 0),
             "latency": fixed_s * (rounds if compute_s >= mem_s + fixed_s else 1),
             "HBM": mem_s + partial_bytes / HBM_BYTES_PER_S,
             "issue": compute_s - rounds * fixed_s}
    which = {lds_cycles: "LDS", VALU_CYCLES * mix["valu"]: "VALU", mfma_cycles: "MFMA",
             ISSUE_CYCLES * issued / k: "issue"}
    bound = max(parts, key=parts.get)
    if bound == "issue":
        bound = which[stage_cycles]
    return dict(splits=splits, stages=stages, wgs=wgs, k=k, total=total, mem=mem_s, compute=compute_s,
                stage=stage_cycles, bound=bound, hbm_floor=kv_bytes / HBM_BYTES_PER_S)


kHeadDimV = 512


def predict(kernels):
    names = {"bf16": "split_kernel_mfma<bf16>", "fp8_e4m3fn": "split_kernel_mfma<fp8_e4m3fn>",
             "mxfp4": "split_kernel_mfma<mxfp4>"}
    if any(n not in kernels for n in names.values()):
        print("  (no prediction: the gfx950 decode kernels were not all compiled)")
        return
    print(f"  Predicted MI355X time per call (model of docs/amd.md: {CUS} CUs at {CLOCK_HZ / 1e9:.1f} GHz,"
          f" {HBM_BYTES_PER_S / 1e12:.0f} TB/s HBM, ASSUMED {LAUNCH_S * 1e6:.0f} us per launch and"
          f" {DRAM_ROUND_TRIP_S * 1e6:.0f} us per DRAM round trip; not measured):")
    hdr = ("H", "batch", "kv", "splits", "stages/WG", "WGs", "WG/CU")
    for fmt in names:
        hdr += (f"{fmt} us", "bound")
    table = [hdr]
    shapes = [(16, b, kv) for b in (4, 32, 64, 256) for kv in (1024, 8192)]
    shapes += [(128, b, kv) for b in (1, 4, 32, 64, 256) for kv in (1024, 8192)]
    logs = defaultdict(float)
    for h, b, kv in shapes:
        row = None
        for fmt, kname in names.items():
            r = predict_one(kernels[kname], fmt, b, h, kv)
            if row is None:
                row = (str(h), str(b), str(kv), str(r["splits"]), str(r["stages"]), str(r["wgs"]), str(r["k"]))
            row += (f"{r['total'] * 1e6:.1f}", r["bound"])
            if h == 16:
                logs[fmt] += math.log(r["total"] * 1e6) / 8
        table.append(row)
    print_table(table, left=tuple(range(8, len(hdr), 2)))
    print("  geometric mean over the 8 competition shapes (H = 16): " +
          ", ".join(f"{fmt} {math.exp(v):.1f} us" for fmt, v in logs.items()))
    for fmt, kname in names.items():
        occ, lds, mix, mfma = kernels[kname]
        issued = sum(v for key, v in mix.items() if key not in ("outside", "lds_bytes"))
        mc = sum(MFMA_CYCLES[m] * n for m, n in mfma.items())
        print(f"  {fmt}: per stage and wave {mix['valu']} VALU ({VALU_CYCLES * mix['valu']} cycles), {mc} MFMA cycles,"
              f" {issued} instructions issued ({ISSUE_CYCLES * issued} cycles alone, / waves per SIMD when they"
              f" co-issue), {mix['lds_bytes']} LDS bytes per lane ({4 * 64 * mix['lds_bytes'] // LDS_BYTES_PER_CYCLE}"
              f" LDS cycles per workgroup); {mix['outside']} instructions outside the loop; {occ} waves/SIMD")


if __name__ == "__main__":
    sys.exit(main())
