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
