"""scripts/split_sweep.py (the plan-tuning sweep of forced split counts): its protocol mode runs,
on the CPU where there is no GPU, and prints one line per format and shape with a time for every
split count that fits the shape."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_protocol_mode_prints_every_split_count():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "split_sweep.py"), "fp8", "--shapes", "2:128",
                          "--splits", "0,1,2,8", "--calls", "5"], capture_output=True, text=True, timeout=600,
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("fp8 2 128")]
    assert len(lines) == 1, res.stdout
    # 8 splits of 32 keys would exceed 128 keys' 4 tiles: skipped; the rest each get a positive time
    found = dict(re.findall(r"(\d+):([0-9.]+)", lines[0].split("protocol", 1)[1]))
    assert sorted(found) == ["0", "1", "2"], lines[0]
    assert all(float(v) > 0 for v in found.values())
