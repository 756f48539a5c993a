"""Rewards beyond a task's own grader: a relative LLM judge over a group, and how rewards combine."""

from components.rewards.compose import NoVerifiableReward, RewardWeights, apply_group_reward
from components.rewards.judge import (
    EngineJudgeClient,
    JudgeClient,
    JudgeConfig,
    JudgeError,
    JudgeReply,
    OpenAIJudgeClient,
    RelativeJudge,
    parse_scores,
    render_conversation,
)

__all__ = [
    "EngineJudgeClient",
    "JudgeClient",
    "JudgeConfig",
    "JudgeError",
    "JudgeReply",
    "NoVerifiableReward",
    "OpenAIJudgeClient",
    "RelativeJudge",
    "RewardWeights",
    "apply_group_reward",
    "parse_scores",
    "render_conversation",
]
