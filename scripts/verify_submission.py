"""End-to-end check of the single-file submission on a GPU machine.

    python scripts/verify_submission.py [--out DIR] [--format bf16|fp8|mxfp4] [--iters N]

1. Writes submission.py with `python -m mla_decode.submission` (a subprocess).
2. Imports it in THIS process without importing the mla_decode package (its
   native library is never loaded here), so custom_kernel must build and
   register the operator itself; MLA_DECODE_STRICT=1 turns any fallback into
   an error.
3. On each of the 8 competition shapes: compares custom_kernel against a
   float64 reference on the same dequantised cache (relative Frobenius error
   < 8e-3 for bf16, the format-derived bound of tests/cases.py), then times it
   under the competition protocol (synchronise, L2 flush, CUDA events around
   one whole call; mean per shape, geometric mean over the shapes).
Writes submission_check.json and prints a table. Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(b, kv) for b in (4, 32, 64, 256) for kv in (1024, 8192)]
# Relative Frobenius error bound per format against exact math on the cache the
# kernel reads (tests/cases.py: bf16 output rounding dominates; fp8 and MXFP4
# are compared on their own dequantised cache, so the same bound applies).
REL_TOL = 8e-3


def load_helpers():
    """mla_decode.inputs / .reference without the package __init__ (which would load _C)."""
    pkg = types.ModuleType("mla_decode")
    pkg.__path__ = [str(ROOT / "mla_decode")]
    sys.modules["mla_decode"] = pkg
    import mla_decode.inputs as inputs  # noqa: E402
    import mla_decode.reference as reference  # noqa: E402
    return inputs, reference


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="./submission_check")
    ap.add_argument("--format", default="bf16", choices=("bf16", "fp8", "mxfp4"))
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("verify_submission: needs a GPU (the CPU fallback is covered by tests/test_submission.py)")
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sub_path = out / "submission.py"
    subprocess.run([sys.executable, "-m", "mla_decode.submission", "-o", str(sub_path)], cwd=ROOT, check=True)

    os.environ["MLA_DECODE_STRICT"] = "1"
    os.environ["MLA_DECODE_FORMAT"] = args.format
    os.environ.setdefault("MLA_DECODE_CACHE", "/tmp/mla_decode_submission_cache")
    inputs, reference = load_helpers()
    spec = importlib.util.spec_from_file_location("submission", sub_path)
    sub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sub)
    t0 = time.time()
    native = sub._build()
    build_s = time.time() - t0
    print(f"native build: {native} in {build_s:.0f} s ({sub._NATIVE_ERROR or 'no error'})")
    if not native:
        return 1
    lib = getattr(torch.ops.mla_decode, "backends", None)
    print("backends:", lib() if lib is not None else "?")

    dev = torch.device("cuda")
    # The protocol's flush (mla_decode.timing.L2Flusher): max(1 GiB, 4 x L2) of random numbers.
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    flush = torch.empty(max(2**30, 4 * l2) // 4, dtype=torch.float32, device=dev)
    rows, ok = [], True
    for b, kv in SHAPES:
        data = inputs.generate_input(b, 1, kv, seed=7, device=dev)
        q, kv_data, qo, kvp, cfg = data
        res = sub.custom_kernel(data)
        # Accuracy on a subset of rows (the whole batch for small shapes): float64 reference on the
        # dequantised cache of the chosen format.
        nb = min(b, 8)
        cache = kv_data["bf16"] if args.format == "bf16" else kv_data[args.format][0]
        scale = None if args.format == "bf16" else kv_data[args.format][1]
        rows_f = reference.dequantize_cache(cache, scale, dtype=torch.float64)[: nb * kv]
        ref, _ = reference.reference_decode(q[:nb].double(), rows_f, qo[: nb + 1], cfg["sm_scale"],
                                            kv_indptr=kvp[: nb + 1])
        ref = ref.cpu()
        rel = float((res[:nb].double().cpu() - ref).norm() / ref.norm())
        good = rel < REL_TOL and res.dtype == torch.bfloat16 and tuple(res.shape) == (b, q.shape[1], 512)
        ok &= good
        # The protocol of mla_decode.timing, written out: importing that module would import
        # the package, whose native library this check must not load.
        times = []
        for i in range(args.iters + 3):
            torch.cuda.synchronize()
            flush.normal_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            sub.custom_kernel(data)
            e.record()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(s.elapsed_time(e) * 1e3)
        mean = sum(times) / len(times)
        rows.append({"batch": b, "kv": kv, "format": args.format, "mean_us": mean, "rel_err": rel, "ok": good})
        print(f"B{b:<4} kv{kv:<5} {args.format:5} {mean:8.1f} us  rel err {rel:.2e}  {'ok' if good else 'FAIL'}")
        del data, q, kv_data, res, ref, rows_f
        torch.cuda.empty_cache()
    gm = math.exp(sum(math.log(r["mean_us"]) for r in rows) / len(rows))
    print(f"geometric mean ({args.format}, submission file, competition protocol): {gm:.1f} us; "
          f"{'all shapes correct' if ok else 'SOME SHAPES FAILED'}")
    (out / "submission_check.json").write_text(json.dumps(
        {"format": args.format, "geomean_us": gm, "build_s": build_s, "rows": rows, "ok": ok,
         "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
