import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(1)    # tiny models: threads only add overhead, and CI has two cores

settings.register_profile("specviz", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          max_examples=int(os.environ.get("SPECVIZ_EXAMPLES", "25")))
settings.load_profile("specviz")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: loads the real SmolLM2 model")
    config.addinivalue_line("markers", "browser: drives the app in headless chromium")


@pytest.fixture(scope="session")
def tokenizer():
    from tiny import TinyTokenizer
    return TinyTokenizer()


@pytest.fixture(scope="session")
def smollm2():
    """The real offline default target (SmolLM2-135M-Instruct), loaded once per test session."""
    from specviz.models import load_model
    return load_model("smollm2-135m")
