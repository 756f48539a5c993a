"""The rollout runner's tests use the same real parts as the harness tests (proxy, bwrap pool, grader)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "harnesses"))

from harness_fixtures import (  # noqa: E402,F401
    builtin_tasks,
    sandbox_pool,
    scripted_proxy,
    slugify_task,
    swe_grader,
)
