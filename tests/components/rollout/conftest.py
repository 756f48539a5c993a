"""The rollout runner's tests use the same real parts as the harness tests (proxy, bwrap pool, grader)."""

from tests.harnesses.harness_fixtures import (  # noqa: F401
    builtin_tasks,
    sandbox_pool,
    scripted_proxy,
    slugify_task,
    swe_grader,
)
