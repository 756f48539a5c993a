"""GRPO with Claude Code as the agent: the unmodified ``claude`` CLI runs inside each task's bubblewrap sandbox,
its only network path leads to the proxy session (``ANTHROPIC_BASE_URL``), and every token it is sent back is
recorded for training. The loop is the SWE recipe's (``recipes/swe_grpo.py``); only the harness differs.

    make setup-test                                        # installs the npm agents into .agents/
    python recipes/claude_code_grpo.py                     # SmolLM2-135M, --bare Claude Code, 2 steps (CPU)
    python recipes/claude_code_grpo.py --claude-code-bare false --model /path/to/long-context-model
    python recipes/claude_code_grpo.py --help              # every field, its meaning and default

``--bare`` (the default here) is Claude Code's documented minimal mode: ~1k prompt tokens instead of ~20k,
which SmolLM2's 8k context window needs. Without it, use a model with a context window of 32k or more.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.recipe_config import option
from components.run.config import SamplingBrickConfig
from components.run.entry import main_entry
from recipes.swe_grpo import SweGrpoConfig, main


@dataclass(kw_only=True, frozen=True)
class ClaudeCodeGrpoConfig(SweGrpoConfig):
    """The SWE GRPO run with Claude Code (every other field as in ``SweGrpoConfig``)."""

    harness: str = option(
        "claude_code", "the agent: claude_code here; any registered harness kind works with the same loop"
    )
    max_turns: int = option(3, "Claude Code's --max-turns")
    sampling: SamplingBrickConfig = option(
        SamplingBrickConfig(max_tokens=192),
        "the policy's sampling (max_tokens: CLAUDE_CODE_MAX_OUTPUT_TOKENS)",
    )


async def claude_code_main(config: ClaudeCodeGrpoConfig) -> None:
    await main(config, recipe="claude_code_grpo")


if __name__ == "__main__":
    main_entry(claude_code_main, ClaudeCodeGrpoConfig, __doc__)
