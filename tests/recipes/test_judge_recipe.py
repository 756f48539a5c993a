"""``--reward judge``: the SWE recipe rewards each group by a relative judge (a real OpenAI-compatible HTTP
server on loopback) and trains on those rewards; the judge's calls never enter the stored trajectories."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections import defaultdict

import pyarrow.parquet as pq
import pytest
import uvicorn
from fastapi import FastAPI, Request

from tests.recipes.recipe_runs import assert_complete_run, run_recipe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RUBRIC = "Prefer runs that edit the code and run the tests. (rubric-marker-7f3a)"


def _later_is_better(prompt: str) -> str:
    numbers = sorted({int(n) for n in re.findall(r"# Trajectory (\d+)\n", prompt)})
    top = max(len(numbers) - 1, 1)
    return json.dumps({"scores": [{"trajectory": n, "score": (n - 1) / top} for n in numbers]})


class JudgeServer:
    """An OpenAI-compatible chat endpoint in a background thread (the recipe is another process)."""

    def __init__(self) -> None:
        app = FastAPI()
        self.prompts: list[str] = []

        @app.post("/v1/chat/completions")
        async def complete(request: Request):
            body = await request.json()
            prompt = "\n".join(str(m["content"]) for m in body["messages"])
            self.prompts.append(prompt)
            text = _later_is_better(prompt)
            return {
                "id": "judge",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> JudgeServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "judge server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def test_swe_recipe_trains_on_judge_rewards(tmp_path, tiny_model_dir):
    rubric = tmp_path / "rubric.md"
    rubric.write_text(RUBRIC)
    run_dir = tmp_path / "run"
    with JudgeServer() as judge:
        run_recipe(
            "swe_grpo",
            "--model", str(tiny_model_dir), "--run-dir", str(run_dir), "--num-steps", "1", "--num-tasks", "1",
            "--group-size", "3", "--max-turns", "1", "--proxy", "local", "--wandb-mode", "offline",
            "--reward", "judge", "--judge-url", f"http://127.0.0.1:{judge.port}/v1", "--rubric", str(rubric),
            "--judge-weight", "2.0", "--algorithm", "dr_grpo",
        )  # fmt: skip
    assert_complete_run(run_dir, num_steps=1, rollouts_per_step=3)
    rows = []
    for path in (run_dir / "trajectories").glob("*.parquet"):
        rows += pq.read_table(path).to_pylist()
    judged = [row for row in rows if "group_reward" in dict(row["metrics"])]
    assert judged, [(row["status"], row["failure_reason"]) for row in rows]
    assert len(judge.prompts) == 1 and RUBRIC in judge.prompts[0]  # one call for the group, with the rubric
    by_group = defaultdict(list)
    for row in judged:
        by_group[row["group_id"]].append(row)
    for members in by_group.values():
        scores = sorted(dict(row["metrics"])["group_reward"] for row in members)
        top = max(len(members) - 1, 1)
        assert scores == [n / top for n in range(len(members))]  # the judge's ranking, one score each
        for row in members:  # judge alone: reward = judge_weight × score, the tests' 0 weighted out
            assert row["reward"] == pytest.approx(2.0 * dict(row["metrics"])["group_reward"])
    for row in rows:  # the judge's prompt never became part of a policy trajectory
        assert "rubric-marker-7f3a" not in row["messages_json"]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["reward"]["kind"] == "judge" and config["reward"]["judge_api_key"] == "***"
    assert (
        config["algorithm"]["kind"] == "dr_grpo"
    )  # the README's `--algorithm dr_grpo`, on rewards that differ
