"""The ``reward`` seam of a recipe (``components.registry.REWARDS``): ``tests`` (the task's grader), ``judge`` (a
relative LLM judge ranks each group against a rubric), or ``tests+judge`` (``tests_weight × tests +
judge_weight × judge``); each kind a registered config class whose ``build`` makes the rewards."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from components.config import option, require, require_non_negative, require_positive
from components.protocols import GroupReward, Reward
from components.registry import REWARDS
from components.rewards.compose import NoVerifiableReward, RewardWeights
from components.rewards.judge import JudgeConfig, OpenAIJudgeClient, RelativeJudge


class RewardBrickConfig(Protocol):
    """A registered kind of the ``reward`` seam."""

    def build(self, tests: Reward) -> tuple[Reward, GroupReward | None, RewardWeights]:
        """The per-rollout reward (given the task's grader ``tests``), the group reward (None: none) and how
        they add up."""
        ...


@REWARDS.register("tests")
@dataclass(kw_only=True, frozen=True)
class HiddenTestsRewardConfig:
    """The task's own grader (hidden tests) alone."""

    def build(self, tests: Reward) -> tuple[Reward, GroupReward | None, RewardWeights]:
        return tests, None, RewardWeights(verifiable=1.0, group=0.0)


@REWARDS.register("judge")
@dataclass(kw_only=True, frozen=True)
class JudgeRewardConfig:
    """A relative LLM judge ranks each group against a rubric (no verifiable reward)."""

    judge_url: str = option(
        "", "OpenAI-compatible judge endpoint, e.g. http://HOST:30000/v1", flag="judge-url"
    )
    judge_model: str = option("judge", "model name sent to the judge endpoint", flag="judge-model")
    judge_api_key: str = option("none", "API key of the judge endpoint", flag="judge-api-key")
    rubric: str = option("", "file holding the judge's rubric (what a good run does)", flag="rubric")
    judge_weight: float = option(1.0, "weight of the judge's score", flag="judge-weight")
    judge_max_attempts: int = option(
        3, "judge calls per group before it is a grading_error", flag="judge-max-attempts"
    )
    judge_usd_per_million_input_tokens: float = option(
        0.0, "judge price per million input tokens (cost metric)", flag="judge-usd-per-million-input-tokens"
    )
    judge_usd_per_million_output_tokens: float = option(
        0.0, "judge price per million output tokens (cost metric)", flag="judge-usd-per-million-output-tokens"
    )

    def __post_init__(self) -> None:
        require_positive(self.judge_max_attempts, "judge_max_attempts")
        for name in (
            "judge_weight",
            "judge_usd_per_million_input_tokens",
            "judge_usd_per_million_output_tokens",
        ):
            require_non_negative(getattr(self, name), name)
        require(
            self.judge_url.startswith(("http://", "https://")),
            "judge_url",
            f"must be an http(s) URL when the reward uses a judge, got {self.judge_url!r}",
        )
        require(
            bool(self.rubric) and Path(self.rubric).is_file(),
            "rubric",
            f"must name a rubric file when the reward uses a judge, got {self.rubric!r}",
        )

    def judge(self) -> RelativeJudge:
        """The relative judge of this config."""
        return RelativeJudge(
            JudgeConfig(
                rubric=Path(self.rubric).read_text(),
                max_attempts=self.judge_max_attempts,
                usd_per_million_input_tokens=self.judge_usd_per_million_input_tokens,
                usd_per_million_output_tokens=self.judge_usd_per_million_output_tokens,
            ),
            OpenAIJudgeClient(base_url=self.judge_url, model=self.judge_model, api_key=self.judge_api_key),
        )

    def build(self, tests: Reward) -> tuple[Reward, GroupReward | None, RewardWeights]:
        return NoVerifiableReward(), self.judge(), RewardWeights(verifiable=0.0, group=self.judge_weight)


@REWARDS.register("tests+judge")
@dataclass(kw_only=True, frozen=True)
class TestsAndJudgeRewardConfig(JudgeRewardConfig):
    """``tests_weight × tests + judge_weight × judge``."""

    tests_weight: float = option(1.0, "weight of the tests' reward", flag="tests-weight")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_non_negative(self.tests_weight, "tests_weight")

    def build(self, tests: Reward) -> tuple[Reward, GroupReward | None, RewardWeights]:
        return tests, self.judge(), RewardWeights(verifiable=self.tests_weight, group=self.judge_weight)
