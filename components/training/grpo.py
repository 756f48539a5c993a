"""Kept so that ``from components.training.grpo import GRPO`` still works; the algorithms live one file each in
``components/training/algorithms/``."""

from components.training.algorithms.grpo import GRPO, GRPOConfig, group_relative_advantages

__all__ = ["GRPO", "GRPOConfig", "group_relative_advantages"]
