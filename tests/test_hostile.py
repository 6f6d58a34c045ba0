"""Hostile input: every case of tests/hostile_cases.py, on the CPU, on meta tensors and (when
present) on the GPU and its checked modes, each asserting its exact outcome.

The cases run in subprocesses (tests/hostile_runner.py), in batches, so a crash or a hang is
a failed test rather than a dead run: a batch that dies or passes its time limit is rerun one
case per process, which names the culprit; the cases it did report keep their outcomes."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from hostile_cases import CASES, by_id, cases_for, evaluate

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "hostile_runner.py")
BATCH = 100            # cases per subprocess
BATCH_TIMEOUT_S = 300  # a batch past this is treated as hung
CASE_TIMEOUT_S = 120   # one case alone

GPU_DEVICES = ("cuda", "cuda-checked", "cuda-env")
DEVICES = ("cpu", "meta") + (GPU_DEVICES if torch.cuda.is_available() else ())


def _run(device, ids, timeout):
    """Outcomes {id: record} reported by one subprocess, and how it ended."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(HERE),
                                                                     os.environ.get("PYTHONPATH")])))
    env.pop("MLA_DECODE_CHECKED", None)
    try:
        proc = subprocess.run([sys.executable, RUNNER, "--device", device], input=json.dumps(ids), text=True,
                              capture_output=True, timeout=timeout, env=env)
        stdout, status = proc.stdout, (None if proc.returncode == 0 else
                                       f"exit code {proc.returncode}; stderr: {proc.stderr[-2000:]}")
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        status = f"timed out after {timeout} s"
    records = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            records[record["id"]] = record
    return records, status


def _run_batch(device, ids):
    records, status = _run(device, ids, BATCH_TIMEOUT_S)
    for case_id in ids:  # a batch that died: the rest one per process, which names the culprit
        if case_id not in records:
            alone, alone_status = _run(device, [case_id], CASE_TIMEOUT_S)
            records[case_id] = alone.get(case_id, {"id": case_id, "outcome": {"crash": alone_status or status}})
    return records


_RESULTS = {}


def results():
    """Every device's outcomes, computed once (the batches in parallel)."""
    if not _RESULTS:
        jobs = []
        for device in DEVICES:
            ids = [c.id for c in cases_for(device)]
            jobs += [(device, ids[i:i + BATCH]) for i in range(0, len(ids), BATCH)]
        workers = 1 if torch.cuda.is_available() else max(1, min(len(jobs), os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            for (device, _), records in zip(jobs, pool.map(lambda job: _run_batch(*job), jobs)):
                _RESULTS.setdefault(device, {}).update(records)
    return _RESULTS


def _params():
    params = []
    for device in ("cpu", "meta") + GPU_DEVICES:
        marks = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")] \
            if device in GPU_DEVICES else []
        params += [pytest.param(device, c.id, id=f"{device}-{c.id}", marks=marks) for c in cases_for(device)]
    return params


@pytest.mark.parametrize("device,case_id", _params())
def test_hostile(device, case_id):
    record = results()[device][case_id]
    verdict = evaluate(by_id()[case_id], device, record["outcome"])
    assert verdict is None, f"{case_id} on {device}: {verdict}"


def test_the_table_is_large_and_covers_every_kind():
    kinds = {type(c.expect).__name__ for c in CASES}
    assert len(CASES) >= 100 and kinds == {"Raises", "Runs", "BadValues"}, (len(CASES), kinds)
    assert len(cases_for("cpu")) >= 100 and len(cases_for("meta")) >= 100


def test_a_crash_or_a_hang_is_an_outcome(tmp_path, monkeypatch):
    """The harness itself: a batch whose process dies is rerun case by case, and the case that
    kills its process is reported as a crash while the others keep their outcomes."""
    import hostile_cases
    monkeypatch.setattr(sys.modules[__name__], "RUNNER", str(tmp_path / "runner.py"))
    (tmp_path / "runner.py").write_text(
        "import json, os, sys\n"
        "for i in json.load(sys.stdin):\n"
        "    if i == 'dies':\n"
        "        os._exit(139)\n"
        "    print(json.dumps({'id': i, 'outcome': {'raised': 'RuntimeError', 'message': 'ok'}}), flush=True)\n")
    records = _run_batch("cpu", ["first", "dies", "after"])
    assert records["first"]["outcome"] == records["after"]["outcome"] == {"raised": "RuntimeError", "message": "ok"}
    assert "exit code 139" in records["dies"]["outcome"]["crash"]
    verdict = hostile_cases.evaluate(by_id()["q float32"], "cpu", records["dies"]["outcome"])
    assert verdict.startswith("the call crashed or hung")


def test_a_hang_is_an_outcome(tmp_path, monkeypatch):
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "RUNNER", str(tmp_path / "runner.py"))
    monkeypatch.setattr(module, "BATCH_TIMEOUT_S", 3)
    monkeypatch.setattr(module, "CASE_TIMEOUT_S", 3)
    (tmp_path / "runner.py").write_text(
        "import json, sys, time\n"
        "for i in json.load(sys.stdin):\n"
        "    if i == 'hangs':\n"
        "        time.sleep(60)\n"
        "    print(json.dumps({'id': i, 'outcome': {'ran': True}}), flush=True)\n")
    records = _run_batch("cpu", ["first", "hangs", "after"])
    assert records["first"]["outcome"] == records["after"]["outcome"] == {"ran": True}
    assert records["hangs"]["outcome"]["crash"] == "timed out after 3 s"
