"""Fixtures for the harness tests (defined in ``harness_fixtures``, shared with the rollout-runner tests)."""

from tests.harnesses.harness_fixtures import (  # noqa: F401
    builtin_tasks,
    sandbox_pool,
    scripted_proxy,
    slugify_task,
    swe_grader,
)
