"""The algorithm options end to end on the Temporal Clue toy recipe (tiny model, real Ray, engine, proxy, bubblewrap, FSDP2
trainer), in one sync run: two teachers (other tiny models, same tokenizer) split the puzzles by a teacher rule
(MOPD-style) and each trained rollout's logprobs in the shards are those of the teacher its rule names; dynamic
sampling replaces groups whose rewards are all equal (capped); the overlong penalty and a mismatch correction
(IcePop) run and report their metrics every step. A vLLM server (the session's real one) is a teacher of one
step. Turn-level credit trains a tic-tac-toe step."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.recipes.recipe_runs import latest_trainer_state, run_recipe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_distillation_dynamic_sampling_overlong_and_icepop_in_one_run(tmp_path, tiny_model_dir):
    from components.models.tiny import build_tiny_model

    teachers = [
        build_tiny_model(tmp_path / f"teacher-{index}", tokenizer_dir=tiny_model_dir, seed=1 + index)
        for index in range(2)
    ]
    run_dir = tmp_path / "run"
    run_recipe(
        "temporal_clue_grpo",
        "--model", str(tiny_model_dir), "--run-dir", str(run_dir), "--num-steps", "2", "--group-size", "2",
        "--puzzles-per-step", "2", "--puzzle-size", "3", "--max-tokens", "24", "--trainer-workers", "1", "--wandb-mode", "offline",
        "--distillation-teachers", ",".join(map(str, teachers)), "--distillation-teacher-rules", ODD_PUZZLES_RULE,
        "--distillation-kl-weight", "0.5",
        "--rollout-dynamic-sampling-enabled", "true", "--rollout-dynamic-sampling-max-extra-groups", "2",
        "--trainer-overlong-mode", "penalty", "--trainer-overlong-max-sampled-tokens", "40",
        "--trainer-overlong-buffer-tokens", "20",
        *ALGORITHM_FLAGS,
        timeout_s=480,
    )  # fmt: skip
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    assert [row["step"] for row in rows] == [0, 1]
    for row in rows:
        assert 0 <= row["dynamic_sampling/extra_groups"] <= 2
        assert row["dynamic_sampling/kept_groups"] + row["dynamic_sampling/dropped_groups"] == (
            2 + row["dynamic_sampling/extra_groups"]
        )
        if row["train/trained"]:
            for key in ("rollout_kl_k1", "rollout_kl_k3", "is_masked_fraction", "is_truncated_fraction"):
                assert f"train/{key}" in row, key
            assert row["train/rollout_kl_k3"] >= 0 and 0 <= row["train/is_masked_fraction"] <= 1
            assert row["data/overlong_penalty_mean"] <= 0
    scored = 0
    for path in sorted((run_dir / "trajectories").glob("shard-*.parquet")):
        for trajectory in pq.read_table(path).to_pylist():
            for segment in trajectory["segments"]:
                teacher_logprobs, mask = segment["teacher_logprobs"], segment["loss_mask"]
                assert len(teacher_logprobs) == len(mask)  # every stored rollout was scored
                assert all(lp < 0 for lp, m in zip(teacher_logprobs, mask, strict=True) if m)
                # ... by the teacher its task's rule names (odd seeds: teacher 1), not by the other one (which
                # teachers appear depends on the groups dynamic sampling kept: a step keeping none stores both)
                named = int(trajectory["task_id"][-1]) % 2
                assert_scored_by(teachers[named], segment, other=teachers[1 - named])
                scored += 1
        groups: dict[str, set] = {}
        for trajectory in pq.read_table(path, columns=["group_id", "reward", "step"]).to_pylist():
            groups.setdefault(trajectory["group_id"], set()).add(trajectory["reward"])
        if rows[trajectory["step"]]["dynamic_sampling/kept_groups"] > 0:  # else the step kept its flat groups
            assert all(len(rewards) > 1 for rewards in groups.values()), groups
    assert latest_trainer_state(run_dir)["step"] == 2
    assert scored > 0 or all(row["dynamic_sampling/kept_groups"] == 0 for row in rows)


ALGORITHM_FLAGS = ("--algorithm-loss-importance-sampling", "icepop")
ODD_PUZZLES_RULE = "temporal-clue-*[13579]=1"  # else teacher 0


def sampled_positions(segment: dict) -> list[int]:
    return [i for i, m in enumerate(segment["loss_mask"]) if m]


def assert_scored_by(teacher: Path, segment: dict, *, other: Path) -> None:
    """The segment's stored teacher logprobs are ``teacher``'s teacher-forced logprobs of its sampled tokens
    (recomputed here with transformers), and not ``other``'s."""
    import torch
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([segment["token_ids"]])
    positions = [i for i in sampled_positions(segment) if i > 0]  # a first token has no teacher-forced score
    if not positions:
        return
    stored = torch.tensor([segment["teacher_logprobs"][i] for i in positions])

    def logprobs(folder: Path) -> torch.Tensor:
        model = _MODELS.get(folder) or _MODELS.setdefault(
            folder, AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
        )
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        all_logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        return all_logprobs[[i - 1 for i in positions]]

    assert torch.allclose(stored, logprobs(teacher), atol=2e-3), (stored, logprobs(teacher))
    assert (stored - logprobs(other)).abs().max() > 1e-2, "the other teacher scores the same"


_MODELS: dict[Path, object] = {}


def test_turn_credit_trains_tictactoe_on_per_turn_rewards(tmp_path, tiny_model_dir, capsys):
    """One tic-tac-toe step with turn-level credit on (flags as the README shows them): the toy agent's
    per-move process rewards are stored per turn and the step plans per-turn advantages from them; the same
    knob from ``--config`` is validated with its dotted name."""
    from components.recipe_config import parse_config
    from recipes.tictactoe_grpo import TicTacToeGrpoConfig

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"trainer": {"batching": {"turn_credit": {"enabled": True, "discount": 2}}}}))
    with pytest.raises(SystemExit):
        parse_config(TicTacToeGrpoConfig, ["--config", str(bad)])
    assert "trainer.batching.turn_credit.discount: must be in [0, 1], got 2" in capsys.readouterr().err
    run_dir = tmp_path / "run"
    run_recipe(
        "tictactoe_grpo",
        "--model", str(tiny_model_dir), "--run-dir", str(run_dir), "--num-steps", "1", "--group-size", "2",
        "--games-per-step", "1", "--max-turns", "3", "--max-tokens", "16", "--trainer-workers", "1",
        "--wandb-mode", "offline", *TURN_CREDIT_FLAGS,
        timeout_s=420,
    )  # fmt: skip
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    stored = [
        (segment["loss_mask"], segment["turn_rewards"])
        for path in sorted((run_dir / "trajectories").glob("shard-*.parquet"))
        for trajectory in pq.read_table(path).to_pylist()
        if trajectory["status"] in ("ok", "turn_limit")
        for segment in trajectory["segments"]
    ]
    assert stored, "no trainable rollout"
    num_turns = 0
    for mask, turn_rewards in stored:
        starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
        assert turn_rewards is not None and len(turn_rewards) == len(starts)  # one reward per model call
        assert all(r in (0.0, 1.0) for r in turn_rewards)  # 1 for a legal move, 0 otherwise
        num_turns += len(starts)
    assert row["data/num_turns"] == row["data/num_turns_with_rewards"] == num_turns
    assert latest_trainer_state(run_dir)["step"] == 1


TURN_CREDIT_FLAGS = ("--trainer-turn-credit-enabled", "true", "--trainer-turn-credit-discount", "0.9")


def test_a_vllm_server_teaches_a_recipe_step(tmp_path, tiny_model_dir, vllm_server):
    """``--distillation-teachers vllm:URL`` (the README's server teacher; the session's real vLLM server, whose
    tiny model shares the policy's tokenizer): one step whose stored teacher logprobs are the server's own
    teacher-forced scores of the sampled tokens, not the embedded policy's."""
    import asyncio

    from components.engine.vllm import VLLMEngine, VLLMEngineConfig

    run_dir = tmp_path / "run"
    run_recipe(
        "temporal_clue_grpo",
        "--model", str(tiny_model_dir), "--run-dir", str(run_dir), "--num-steps", "1", "--group-size", "2",
        "--puzzles-per-step", "1", "--puzzle-size", "3", "--max-tokens", "16", "--trainer-workers", "1",
        "--wandb-mode", "offline", "--distillation-teachers", f"vllm:{vllm_server.url}",
        timeout_s=420,
    )  # fmt: skip
    segments = [
        segment
        for path in sorted((run_dir / "trajectories").glob("shard-*.parquet"))
        for trajectory in pq.read_table(path).to_pylist()
        for segment in trajectory["segments"]
        if trajectory["status"] in ("ok", "turn_limit")
    ]
    assert segments, "no trainable rollout"

    async def server_scores() -> list[list[float]]:
        engine = await VLLMEngine.connect(
            VLLMEngineConfig.for_url(vllm_server.url, logprobs_mode="processed_logprobs")
        )
        try:
            return [list(await engine.logprobs_of(segment["token_ids"], 1)) for segment in segments]
        finally:
            await engine.aclose()

    for segment, scores in zip(segments, asyncio.run(server_scores()), strict=True):
        positions = [i for i in sampled_positions(segment) if i > 0]
        stored = [segment["teacher_logprobs"][i] for i in positions]
        assert stored == pytest.approx([scores[i - 1] for i in positions], abs=2e-3)
    assert latest_trainer_state(run_dir)["step"] == 1
