"""On-policy distillation: the teacher's per-token signal as the advantage (by hand), scores recorded in the
trajectory (Parquet round trip, never re-scored), a real embedded-engine teacher, the per-task teacher rule and
the tokenizer check."""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import replace

import numpy as np
import pytest

from components.training.data import SampleBatchConfig, build_micro_batches_locally
from components.training.distillation import (
    DistillationConfig,
    TeacherScorer,
    require_same_tokenizer,
    score_trajectory,
    score_with_teachers,
    token_advantages,
)
from components.training.grpo import GRPO, GRPOConfig
from components.trajectory_store import TrajectoryStore
from tests.components.training.training_synthetic import make_segment, make_trajectory


class ConstantTeacher:
    """A teacher whose logprob of every token is ``value`` (records the calls)."""

    def __init__(self, value: float) -> None:
        self.value, self.calls = value, 0

    async def logprobs_of(self, input_ids, start=1):
        self.calls += 1
        return [self.value] * (len(input_ids) - start)


def group():
    """Two trajectories of one group (rewards 1 and 0: task advantages ±1/2 without std division)."""
    return [
        make_trajectory("t1", "a", 1.0, (make_segment(2, 3, seed=1),)),
        make_trajectory("t2", "a", 0.0, (make_segment(3, 2, seed=2),)),
    ]


def test_token_advantages_by_hand():
    mask = np.array([0, 1, 1, 0])
    student = np.array([0.0, -1.0, -2.0, 0.0])
    teacher = np.array([0.0, -0.5, -3.0, 0.0])
    config = DistillationConfig(teachers=("t",), kl_weight=2.0, reward_weight=0.5)
    # 0.5·A + 2·(teacher − student): token 1: 0.5 + 1.0, token 2: 0.5 − 2.0
    assert token_advantages(
        config, 1.0, loss_mask=mask, student_logprobs=student, teacher_logprobs=teacher
    ).tolist() == [
        0.0,
        1.5,
        -1.5,
        0.0,
    ]


def test_scored_segments_get_per_token_advantages_in_the_micro_batches():
    teacher = ConstantTeacher(-0.25)
    scored = asyncio.run(score_with_teachers(DistillationConfig(teachers=("x",)), [teacher], group()))
    assert teacher.calls == 2
    config = SampleBatchConfig(
        distillation=DistillationConfig(teachers=("x",), kl_weight=1.0, reward_weight=0.0)
    )
    batches = build_micro_batches_locally(
        scored, GRPO(GRPOConfig(normalize_advantages_by_std=False)), config, current_version=0
    )
    row = batches.micro_batches.to_pylist()[0]
    mask = np.asarray(row["loss_mask"]) == 1
    old = np.asarray(row["old_logprobs"])
    # distillation alone: the advantage of each sampled token is −0.25 − its own rollout logprob
    np.testing.assert_allclose(np.asarray(row["advantages"])[mask], (-0.25 - old)[mask], rtol=1e-6)
    # unscored segments keep the task advantage (±0.5) on every token
    plain = build_micro_batches_locally(
        group(), GRPO(GRPOConfig(normalize_advantages_by_std=False)), config, current_version=0
    )
    advantages = np.asarray(plain.micro_batches.to_pylist()[0]["advantages"])
    assert set(np.round(advantages, 6).tolist()) == {0.5, -0.5}


def test_scores_are_recorded_in_the_shard_and_never_asked_again(tmp_path):
    scored = asyncio.run(score_trajectory(ConstantTeacher(-1.5), group()[0]))
    segment = scored.segments[0]
    assert segment.teacher_logprobs.tolist() == np.where(segment.loss_mask == 1, -1.5, 0.0).tolist()
    store = TrajectoryStore(tmp_path)
    (read_back,) = store.read_shard(store.write([scored]))
    assert read_back == scored
    again = ConstantTeacher(-9.0)
    assert asyncio.run(score_trajectory(again, read_back)) == scored and again.calls == 0


def test_an_embedded_engine_teacher_scores_teacher_forced(tmp_path, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from components.models.tiny import build_tiny_model

    teacher_dir = build_tiny_model(tmp_path / "teacher", tokenizer_dir=tiny_model_dir, seed=1)
    require_same_tokenizer(tiny_model_dir, teacher_dir)  # same tokenizer: no error
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=teacher_dir))
    try:
        assert isinstance(engine, TeacherScorer)
        trajectory = make_trajectory("t1", "a", 1.0, (make_segment(3, 4, seed=1, vocab=1000),))
        scored = asyncio.run(score_trajectory(engine, trajectory)).segments[0]
    finally:
        engine.close()
    model = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32)
    ids = torch.as_tensor(scored.token_ids, dtype=torch.long)[None]
    with torch.no_grad():
        expected = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1).gather(1, ids[0, 1:, None])[
            :, 0
        ]
    mask = scored.loss_mask[1:] == 1
    np.testing.assert_allclose(scored.teacher_logprobs[1:][mask], expected.numpy()[mask], atol=1e-4)
    assert (scored.teacher_logprobs[scored.loss_mask == 0] == 0).all()


def test_a_teacher_with_another_tokenizer_is_a_config_error(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<only-the-teacher-knows>"])
    tokenizer.save_pretrained(other)
    with pytest.raises(ValueError, match=r"^distillation\.teachers: .* tokenizes differently"):
        require_same_tokenizer(tiny_model_dir, other)


def test_each_task_gets_the_teacher_its_rule_names():
    config = DistillationConfig(teachers=("math", "code"), teacher_rules=("swe-*=1", "*-hard=0"))
    assert [config.teacher_index(t) for t in ("swe-1", "x-hard", "other")] == [1, 0, 0]
    math, code = ConstantTeacher(-1.0), ConstantTeacher(-2.0)
    trajectories = [replace(t, task_id=task) for t, task in zip(group(), ("swe-7", "ttt"), strict=True)]
    scored = asyncio.run(score_with_teachers(config, [math, code], trajectories))
    assert (math.calls, code.calls) == (1, 1)
    assert scored[0].segments[0].teacher_logprobs.min() == -2.0
    with pytest.raises(ValueError, match="^teacher_rules:"):
        DistillationConfig(teachers=("a",), teacher_rules=("*=1",))
    with pytest.raises(ValueError, match="^kl_weight:"):
        DistillationConfig(kl_weight=-1.0)
