"""Rollouts: run a harness on tasks × group size, grade, and finalize trajectories.

    runner = RolloutRunner(
        RolloutConfig(group_size=8, max_concurrency=16),
        harness=SweAgentHarness(SweAgentConfig(max_turns=30)),   # or BlackBoxHarness(ClaudeCodeAgent(), ...)
        sandboxes=SandboxPool(...),                               # anything with acquire(spec) / release(sandbox)
        sessions=registry,                                        # the proxy's SessionRegistry
        proxy_url=proxy.url,                                      # http://127.0.0.1:PORT
        grader=SweGrader(BwrapSandbox.create),
    )
    trajectories = await runner.run(tasks, step)

``failures`` holds the one classification of how an agent run ended (used by harnesses and the runner).
"""

from components.rollout.runner import RolloutConfig, RolloutRunner, SandboxProvider, SessionControl

__all__ = ["RolloutConfig", "RolloutRunner", "SandboxProvider", "SessionControl"]
