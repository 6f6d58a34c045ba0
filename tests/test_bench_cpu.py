"""The CPU benchmark's timing (mla_decode/bench_cpu.py): plain PyTorch and the implementations are
timed in interleaved rounds and the speedup is the median of the rounds' paired ratios, so a load
change during a shape reaches both sides of the ratio."""
import csv

import pytest
import torch

from mla_decode import bench_cpu
from mla_decode._ops import native_available


def test_interleaved_rounds_alternate_the_callables():
    order = []
    fns = [lambda i=i: order.append(i) for i in range(3)]
    res = bench_cpu._interleaved_ms(fns, rounds=3, min_time=0.0)
    assert order == [0, 1, 2] + [0, 1, 2] * 3  # one warm-up call each, then three rounds
    assert len(res) == 3
    for med, mn, per_round in res:
        assert len(per_round) == 3 and 0 <= mn <= med


def test_paired_speedup_is_the_median_of_the_rounds_ratios():
    # a load burst in round 2 slows both sides; the pooled medians would give 12.5 / 7.5 = 1.67
    assert bench_cpu._paired_speedup([10.0, 20.0, 10.0], [5.0, 10.0, 10.0]) == pytest.approx(2.0)


@pytest.mark.skipif(not native_available(), reason="needs the built extension")
def test_tiny_grid_writes_paired_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_cpu, "SHAPES_H", (16,))
    monkeypatch.setattr(bench_cpu, "SHAPES_B", (1,))
    monkeypatch.setattr(bench_cpu, "SHAPES_KV", (64,))
    monkeypatch.setattr(bench_cpu, "read_bandwidth_gbps", lambda nbytes=0: 10.0)
    threads = torch.get_num_threads()
    rows = bench_cpu.run_cpu_benchmark(str(tmp_path), threads=(1,), quick=True, formats=("bf16",), paths=[],
                                       verbose=False)
    assert torch.get_num_threads() == threads
    assert [r["impl"] for r in rows] == ["plain", "op:auto"]
    op = rows[1]
    assert op["ms"] > 0 and op["ms_min"] <= op["ms"] and op["speedup"] > 0
    assert op["floor_ms"] == pytest.approx(64 * 1152 / 10e9 * 1e3, abs=1e-4)  # rounded to 4 decimals
    text = (tmp_path / "cpu_bench.csv").read_text()
    assert "3 interleaved rounds per shape" in text
    data = list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))
    assert [d["impl"] for d in data] == ["plain", "op:auto"]
