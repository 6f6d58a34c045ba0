"""scripts/ab_trees.sh without a GPU: `prepare` writes a revision's tracked files (and its short
name) where `run` looks for them; bad arguments and a missing base tree are refused with a
sentence, before anything is built."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "ab_trees.sh"


def ab(*args, base):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "AB_BASE": str(base), "OUT": str(base.parent / "out")})


def test_prepare_writes_the_revision_tree(tmp_path):
    base = tmp_path / "base"
    r = ab("prepare", "HEAD", base=base)
    assert r.returncode == 0, r.stdout + r.stderr
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    assert (base / ".ab_rev").read_text().strip() == head.strip()
    tracked = subprocess.run(["git", "ls-files", "setup.py", "csrc/plan/plan.cpp"], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert tracked and all((base / f).is_file() for f in tracked)
    assert not (base / ".git").exists()


def test_refuses_bad_arguments_and_a_missing_base(tmp_path):
    base = tmp_path / "base"
    r = ab("prepare", "no-such-revision", base=base)
    assert r.returncode == 2 and "is not a commit" in r.stdout
    r = ab("run", "2", "true", base=base)
    assert r.returncode == 2 and "is missing" in r.stdout and not (tmp_path / "out").exists()
    r = ab("compare", base=base)
    assert r.returncode == 2 and "usage" in r.stdout
