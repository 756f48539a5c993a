"""Harnesses: the agent programs Rein trains, each a ``components.protocols.Harness``.

- ``harnesses.swe_agent.SweAgentHarness``: a compact white-box coding agent (OpenAI SDK tool loop with
  ``bash`` / ``view_file`` / ``edit_file`` / ``submit``, tools in ``harnesses.coding_tools``).
- ``harnesses.wrap.agent_harness``: wrap your own ``async def agent(ctx)`` into a harness (ART-style).
- ``harnesses.toy_agent.ToyAgentHarness``: multi-turn tool use on the toy games (tic-tac-toe, 2048).
- ``harnesses.blackbox.BlackBoxHarness``: an unmodified agent program in the sandbox, with one small adapter
  per program: ``claude_code.ClaudeCodeAgent``, ``codex.CodexAgent``, ``mini_swe_agent.MiniSweAgent``.

Submodules are imported on demand.
"""
