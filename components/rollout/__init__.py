"""Rollouts: run a harness on tasks × group size, grade, and finalize trajectories."""

from components.rollout.runner import RolloutConfig, RolloutRunner, SandboxProvider

__all__ = ["RolloutConfig", "RolloutRunner", "SandboxProvider"]
