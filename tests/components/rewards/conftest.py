"""The judge's runner test uses the same real parts as the harness tests (proxy, bwrap pool)."""

from tests.harnesses.harness_fixtures import builtin_tasks, sandbox_pool, scripted_proxy  # noqa: F401
