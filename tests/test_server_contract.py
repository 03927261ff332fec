"""The Target contract suite (tests/test_target_contract.py) run against the server target: a real
`transformers serve` of the tiny model, over one start-time flag (dtype) and one request field
(frequency_penalty), so the suite's every-value checks restart the server only a few times."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_serving_model  # noqa: E402
from test_server_target import HAVE_SERVE  # noqa: E402
from test_target_contract import *  # noqa: E402,F401,F403  (the suite's tests, collected here)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not HAVE_SERVE, reason="needs transformers[serving] (the test extras)")]


@pytest.fixture(scope="module")
def target(tmp_path_factory):  # overrides the suite's fixture: one server target for the module
    from autoopt.targets.server.target import from_spec

    root = tmp_path_factory.mktemp("contract")
    model = tiny_serving_model.cached_build(tmp_path_factory.getbasetemp())
    space = tiny_serving_model.write_space(root / "space.yaml", model, root / "home",
                                           knobs=("dtype", "frequency_penalty"))
    t, _ = from_spec(space, run_dir=root / "run")
    yield t
    t.close()
