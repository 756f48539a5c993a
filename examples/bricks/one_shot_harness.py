"""A third-party harness brick in one file: ask the policy once, write its reply into ``answer.txt`` (what
``examples.bricks.answer_file_reward`` grades). Failures become an outcome, never an exception.

    pytest tests/contracts/test_harness_contract.py --brick examples.bricks.one_shot_harness:OneShotHarness
"""

from dataclasses import dataclass

from openai import AsyncOpenAI

from components.protocols import HarnessOutcome
from components.rollout.failures import outcome_from_exception


class OneShotHarness:
    """Implements ``components.protocols.Harness``: one model call, then one file write."""

    name = "one-shot"

    async def run(self, *, task, sandbox, base_url: str, api_key: str) -> HarnessOutcome:
        client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=1, timeout=60)
        try:
            reply = await client.chat.completions.create(
                model="policy", max_tokens=32, messages=[{"role": "user", "content": task.problem_statement}]
            )
            answer = reply.choices[0].message.content or ""
            await sandbox.write_file("answer.txt", answer.strip())
        except Exception as error:  # the contract: report (engine_error, sandbox_error, ...), never raise
            return outcome_from_exception(error)
        finally:
            await client.close()
        return HarnessOutcome(status="ok", metrics={"answer_chars": float(len(answer))}, log=answer)


@dataclass(kw_only=True, frozen=True)
class OneShotHarnessConfig:
    """What ``--harness one_shot`` picks once registered, with no edit of Rein, through the ``rein.bricks`` entry
    point group: ``[project.entry-points."rein.bricks"]``
    ``"harness.one_shot" = "examples.bricks.one_shot_harness:OneShotHarnessConfig"``."""

    def read_only_paths(self) -> tuple[str, ...]:
        return ()

    def build(
        self, *, max_turns: int, wall_time_s: float, max_tokens: int, temperature: float
    ) -> OneShotHarness:
        return OneShotHarness()
