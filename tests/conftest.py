import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "cuda" in item.name or "gpu" in item.keywords:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line saying why tests were skipped (no GPU, no Hopper build, ...), so a run without a GPU
    shows what did not run; `pytest -rs` lists them one by one."""
    reasons = {}
    for rep in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(rep, "longrepr", None)
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
        reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        parts = [f"{n} {why}" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
        terminalreporter.write_line(f"skipped {sum(reasons.values())}: " + "; ".join(parts) + " (pytest -rs lists them)")
