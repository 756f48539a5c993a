"""The reward brick of a recipe: the task's own grader (``tests``), a relative judge (``judge``), or both."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from components.config import require, require_non_negative, require_positive
from components.protocols import GroupReward, Reward
from components.recipe_config import option
from components.rewards.compose import NoVerifiableReward, RewardWeights
from components.rewards.judge import JudgeConfig, OpenAIJudgeClient, RelativeJudge

REWARD_KINDS = ("tests", "judge", "tests+judge")


@dataclass(kw_only=True, frozen=True)
class RewardBrickConfig:
    """How a rollout is rewarded: ``tests`` (the task's grader), ``judge`` (a relative LLM judge ranks each
    group against a rubric), or ``tests+judge`` (``tests_weight × tests + judge_weight × judge``)."""

    kind: Literal["tests", "judge", "tests+judge"] = option(
        "tests", "reward: the task's hidden tests, an LLM judge, or both (tests+judge)", flag="reward"
    )
    judge_url: str = option(
        "", "OpenAI-compatible judge endpoint, e.g. http://HOST:30000/v1", flag="judge-url"
    )
    judge_model: str = option("judge", "model name sent to the judge endpoint", flag="judge-model")
    judge_api_key: str = option("none", "API key of the judge endpoint", flag="judge-api-key")
    rubric: str = option("", "file holding the judge's rubric (what a good run does)", flag="rubric")
    tests_weight: float = option(1.0, "weight of the tests' reward (tests+judge)", flag="tests-weight")
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
        require(self.kind in REWARD_KINDS, "kind", f"must be one of {REWARD_KINDS}, got {self.kind!r}")
        require_positive(self.judge_max_attempts, "judge_max_attempts")
        for name in (
            "tests_weight",
            "judge_weight",
            "judge_usd_per_million_input_tokens",
            "judge_usd_per_million_output_tokens",
        ):
            require_non_negative(getattr(self, name), name)
        if self.kind != "tests":
            require(
                self.judge_url.startswith(("http://", "https://")),
                "judge_url",
                f"must be an http(s) URL when the reward is {self.kind!r}, got {self.judge_url!r}",
            )
            require(
                bool(self.rubric) and Path(self.rubric).is_file(),
                "rubric",
                f"must name a rubric file when the reward is {self.kind!r}, got {self.rubric!r}",
            )

    def build(self, tests: Reward) -> tuple[Reward, GroupReward | None, RewardWeights]:
        """The per-rollout reward, the group reward (None: tests only) and how they add up."""
        if self.kind == "tests":
            return tests, None, RewardWeights(verifiable=1.0, group=0.0)
        judge = RelativeJudge(
            JudgeConfig(
                rubric=Path(self.rubric).read_text(),
                max_attempts=self.judge_max_attempts,
                usd_per_million_input_tokens=self.judge_usd_per_million_input_tokens,
                usd_per_million_output_tokens=self.judge_usd_per_million_output_tokens,
            ),
            OpenAIJudgeClient(base_url=self.judge_url, model=self.judge_model, api_key=self.judge_api_key),
        )
        if self.kind == "judge":
            return NoVerifiableReward(), judge, RewardWeights(verifiable=0.0, group=self.judge_weight)
        return tests, judge, RewardWeights(verifiable=self.tests_weight, group=self.judge_weight)
