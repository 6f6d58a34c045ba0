"""Runs hostile-input cases (tests/hostile_cases.py) and reports each outcome, one JSON line
per case: {"id", "device", "outcome", "verdict"} (verdict None: as expected).

    python3 tests/hostile_runner.py --device cpu < ids.json      # the cases named in a JSON list
    python3 tests/hostile_runner.py --device cuda --all --check  # every case of a device; exit 1 on
                                                                 # a mismatch (compute-sanitizer runs this)

Devices: cpu, meta, cuda, and the GPU's checked modes cuda-checked (decode(checked=True)) and
cuda-env (MLA_DECODE_CHECKED=1, set here before the first call). --device takes a
comma-separated list (cuda-env must come alone: the switch holds for the process).
tests/test_hostile.py runs this in batches, each in a subprocess, so that a crash or a hang
costs one batch; the cases of a batch that died are then run one per process to name it.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", required=True)
    ap.add_argument("--all", action="store_true", help="every case of the device(s), instead of ids on stdin")
    ap.add_argument("--check", action="store_true", help="exit 1 when an outcome is not the expected one")
    args = ap.parse_args()
    devices = args.device.split(",")
    if "cuda-env" in devices:
        if len(devices) > 1:
            ap.error("cuda-env sets MLA_DECODE_CHECKED=1 for the whole process: run it alone")
        os.environ["MLA_DECODE_CHECKED"] = "1"
    import warnings
    warnings.simplefilter("ignore")
    import torch  # noqa: F401
    import mla_decode  # noqa: F401
    from hostile_cases import by_id, cases_for, evaluate, outcome_of

    table = by_id()
    wanted = None if args.all else json.load(sys.stdin)
    bad = 0
    for device in devices:
        cases = cases_for(device) if wanted is None else [table[i] for i in wanted]
        for case in cases:
            outcome = outcome_of(case, device)
            verdict = evaluate(case, device, outcome)
            bad += verdict is not None
            print(json.dumps({"id": case.id, "device": device, "outcome": outcome, "verdict": verdict}), flush=True)
    if args.check:
        print(f"hostile cases: {bad} not as expected", file=sys.stderr)
    return 1 if args.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
