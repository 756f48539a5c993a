"""A third-party reward brick in one file: 1 when the agent left the expected answer in ``answer.txt``.

pytest tests/contracts/test_reward_contract.py --brick examples.bricks.answer_file_reward:AnswerFileReward
"""

from components.errors import SandboxError
from components.protocols import RewardResult


class AnswerFileReward:
    """Implements ``components.protocols.Reward``."""

    def __init__(self, expected: str = "42") -> None:
        self.expected = expected

    async def score(self, task, agent_sandbox) -> RewardResult:
        try:
            answer = (await agent_sandbox.read_file("answer.txt")).decode(errors="replace").strip()
        except FileNotFoundError:
            return RewardResult(reward=0.0, log="no answer.txt")  # the agent's doing: a real 0
        except SandboxError as error:
            return RewardResult(reward=None, error=f"could not read the answer: {error}")  # not the agent's
        return RewardResult(reward=float(answer == self.expected), log=f"answer {answer!r}")
