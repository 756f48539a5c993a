"""On-policy distillation: a teacher model scores the tokens the student (the policy) sampled, teacher-forced,
and the per-token reverse-KL signal log π_teacher(y_t) − log π_student(y_t) becomes the advantage of token t,
alone or mixed with the task reward's advantage:

    A_t = reward_weight · A_task + kl_weight · (log π_teacher(y_t) − log π_student(y_t))

(the student's logprob is the rollout's own, so the signal is fixed when the step is planned; its expectation
over the student's samples is −KL(π_student ‖ π_teacher), the reverse KL, as in Agarwal et al. / Thinking
Machines' on-policy distillation). Several teachers may be given, chosen per task by ``teacher_rules``
("glob=index" over task ids, first match; else teacher 0: multi-teacher distillation as in MOPD).

A teacher is anything with ``logprobs_of(input_ids, start)`` (``TeacherScorer``): the embedded engine over another
model folder does it in process, and the vLLM and SGLang clients ask their server (``server_teachers.py``:
``vllm:URL`` / ``sglang:URL`` entries). Scores are recorded in the trajectory (``Segment.teacher_logprobs``) before its
shard is written, so a resumed run trains from the stored scores and never asks the teacher again. The teacher
must tokenize exactly as the student does (``require_same_tokenizer``): it scores the student's token ids.
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from components.config import require, require_non_negative
from components.recipe_config import option
from components.trajectory import Trajectory


@dataclass(kw_only=True, frozen=True)
class DistillationConfig:
    """Teachers, which task each one teaches, and how their signal mixes with the task reward."""

    teachers: tuple[str, ...] = option(
        (),
        "teachers (same tokenizer as the policy): HF model folders (embedded engines) or vllm:URL / sglang:URL "
        "servers; () = off",
    )
    teacher_rules: tuple[str, ...] = option(
        (), "which teacher scores a task: 'glob=index' over task ids, first match wins; else teacher 0"
    )
    kl_weight: float = option(1.0, "weight of the per-token reverse-KL advantage (log teacher - log student)")
    reward_weight: float = option(1.0, "weight of the task reward's advantage (0: distillation alone)")

    def __post_init__(self) -> None:
        require_non_negative(self.kl_weight, "kl_weight")
        require_non_negative(self.reward_weight, "reward_weight")
        for rule in self.teacher_rules:
            pattern, _, index = rule.rpartition("=")
            require(
                bool(pattern) and index.isdigit() and int(index) < len(self.teachers),
                "teacher_rules",
                f"{rule!r} must be 'glob=index' with index < {len(self.teachers)} (the number of teachers)",
            )

    @property
    def enabled(self) -> bool:
        return bool(self.teachers)

    def teacher_index(self, task_id: str) -> int:
        """The teacher of ``task_id``: the first rule whose glob matches it, else 0."""
        for rule in self.teacher_rules:
            pattern, _, index = rule.rpartition("=")
            if fnmatch.fnmatchcase(task_id, pattern):
                return int(index)
        return 0


@runtime_checkable
class TeacherScorer(Protocol):
    """Teacher-forced scoring. Contract: ``logprobs_of(ids, start)`` returns log p(ids[i] | ids[:i]) for every
    i in [start, len(ids)) under the teacher, as floats."""

    async def logprobs_of(self, input_ids: Sequence[int], start: int = 1) -> Sequence[float]: ...


def require_same_tokenizer(
    student: Path | str, teacher: Path | str, *, field: str = "distillation.teachers"
) -> None:
    """``ValueError`` naming ``field`` unless both model folders' tokenizers map every token the same way."""
    from transformers import AutoTokenizer

    student_vocab = AutoTokenizer.from_pretrained(student).get_vocab()
    teacher_vocab = AutoTokenizer.from_pretrained(teacher).get_vocab()
    if student_vocab != teacher_vocab:
        differing = len(set(student_vocab.items()) ^ set(teacher_vocab.items()))
        raise ValueError(
            f"{field}: {teacher} tokenizes differently from the policy {student} ({len(teacher_vocab)} vs "
            f"{len(student_vocab)} tokens, {differing} entries differ); a teacher scores the student's token ids, "
            "so it needs the same tokenizer"
        )


async def score_trajectory(teacher: TeacherScorer, trajectory: Trajectory) -> Trajectory:
    """``trajectory`` with each segment's ``teacher_logprobs``: the teacher's logprob of every sampled token
    (0 elsewhere), teacher-forced on the segment's ids. Already scored segments are kept as they are."""
    segments = []
    for segment in trajectory.segments:
        if segment.teacher_logprobs is not None or len(segment.token_ids) < 2 or not segment.loss_mask.any():
            segments.append(segment)
            continue
        scored = np.zeros(len(segment.token_ids), dtype=np.float32)
        scored[1:] = np.asarray(await teacher.logprobs_of(segment.token_ids.tolist(), 1), dtype=np.float32)
        segments.append(replace(segment, teacher_logprobs=np.where(segment.loss_mask == 1, scored, 0.0)))
    return replace(trajectory, segments=tuple(segments))


async def score_with_teachers(
    config: DistillationConfig, teachers: Sequence[TeacherScorer], trajectories: Sequence[Trajectory]
) -> list[Trajectory]:
    """Every trainable trajectory scored by the teacher its task's rule picks (concurrently)."""

    async def one(trajectory: Trajectory) -> Trajectory:
        if not trajectory.trainable:
            return trajectory
        return await score_trajectory(teachers[config.teacher_index(trajectory.task_id)], trajectory)

    return list(await asyncio.gather(*(one(t) for t in trajectories)))


def token_advantages(
    config: DistillationConfig,
    task_advantage: float | np.ndarray,
    *,
    loss_mask: np.ndarray,
    student_logprobs: np.ndarray,
    teacher_logprobs: np.ndarray,
) -> np.ndarray:
    """Per token: reward_weight·A_task + kl_weight·(teacher − student logprob) on sampled tokens (0 elsewhere)."""
    signal = np.asarray(teacher_logprobs, np.float64) - np.asarray(student_logprobs, np.float64)
    advantages = config.reward_weight * task_advantage + config.kl_weight * signal
    return np.where(np.asarray(loss_mask) == 1, advantages, 0.0).astype(np.float32)
