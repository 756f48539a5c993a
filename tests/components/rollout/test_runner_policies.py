"""Multi-LoRA through the whole rollout path: two runners, each bound to its own policy (``RolloutConfig.policy``),
share one engine actor (``RayEngineClient.policy``) behind one proxy on Ray Serve over session shards; every
session is bound to its runner's policy when it is opened, so each sampled token is that policy's adapter's
(teacher-forced with plain peft) and carries that adapter's version, whatever ``model`` the agent names."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from components.protocols import RewardResult, Sandbox, Task
from components.rollout import RolloutConfig, RolloutRunner
from components.trajectory import TrajectoryStatus
from harnesses.wrap import AgentContext, agent_harness
from tests.components.engine.test_multi_lora import random_adapter, teacher_forced

pytestmark = pytest.mark.timeout(300)
MAX_TOKENS = 8


class NoReward:
    """A grader that reaches a verdict without looking (this test checks what was sampled, not the task)."""

    async def score(self, task: Task, agent_sandbox: Sandbox) -> RewardResult:
        return RewardResult(reward=0.0, log="not graded")


def agent_naming(model: str):
    """An agent that asks for ``model`` (the *other* policy's name): the proxy must ignore it."""

    @agent_harness(name=f"asks-for-{model}")
    async def agent(ctx: AgentContext) -> None:
        await ctx.openai.chat.completions.create(
            model=model, messages=[{"role": "user", "content": ctx.task.problem_statement[:200]}], seed=7
        )

    return agent


@pytest.fixture(scope="module")
def adapters(tiny_model_dir):
    """Two random adapters (alice's, bob's) over the tiny model, each with its plain-peft reference model."""
    return random_adapter(tiny_model_dir, seed=1), random_adapter(tiny_model_dir, seed=2)


async def run_both_policies(registry, url: str, keys, slugify_task, sandbox_pool) -> tuple[list, list]:
    """Alice's runner and bob's runner at the same time, each agent naming the other policy."""

    def runner(policy: str, other: str) -> RolloutRunner:
        return RolloutRunner(
            RolloutConfig(group_size=2, max_concurrency=2, policy=policy),
            harness=agent_naming(other),
            sandboxes=sandbox_pool,
            sessions=registry,
            proxy_url=url,
            grader=NoReward(),
            session_keys=keys,  # the proxy is closed by default: each agent gets its session's token
        )

    return await asyncio.gather(
        runner("alice", "bob").run([slugify_task], step=1), runner("bob", "alice").run([slugify_task], step=1)
    )


def check_own_policy(runs: tuple[list, list], adapters) -> None:
    """Every sampled token is its runner's policy's (teacher-forced), with that adapter's version."""
    (alice_model, _), (bob_model, _) = adapters
    alice_runs, bob_runs = runs
    for trajectories, own, other, version in (
        (alice_runs, alice_model, bob_model, 5),
        (bob_runs, bob_model, alice_model, 9),
    ):
        assert len(trajectories) == 2
        for trajectory in trajectories:
            assert trajectory.status == TrajectoryStatus.OK, trajectory.failure_reason
            [segment] = trajectory.segments
            ids, mask = segment.token_ids.tolist(), segment.loss_mask.astype(bool)
            assert mask.sum() == MAX_TOKENS
            sampled = segment.logprobs[mask]
            expected = np.asarray(teacher_forced(own, ids, 1))[mask[1:]]
            wrong = np.asarray(teacher_forced(other, ids, 1))[mask[1:]]
            assert np.abs(sampled - expected).max() <= 1e-4
            assert np.abs(sampled - wrong).max() > 1e-3  # the check tells the two adapters apart
            assert set(segment.weight_versions[mask].tolist()) == {version}


async def test_two_runners_each_bound_to_its_policy_on_one_embedded_engine(
    tiny_model_dir, adapters, slugify_task, sandbox_pool
):
    """In one process: a ``LocalSessionRegistry`` over ``EmbeddedEngine.policy`` views, served over HTTP."""
    from transformers import AutoTokenizer

    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from components.proxy.config import ProxyConfig
    from components.proxy.server import ProxyServer
    from components.proxy.sessions import LocalSessionRegistry

    (_, alice_adapter), (_, bob_adapter) = adapters
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_model_dir, eos_token_ids=()))
    alice, bob = engine.policy("alice"), engine.policy("bob")
    await alice.update_adapter(alice_adapter, 5)
    await bob.update_adapter(bob_adapter, 9)
    config = ProxyConfig(port=0, default_max_tokens=MAX_TOKENS)
    registry = LocalSessionRegistry(
        engine, AutoTokenizer.from_pretrained(tiny_model_dir), config, policies={"alice": alice, "bob": bob}
    )
    server = ProxyServer(registry, config)
    server.start_in_thread()
    try:
        runs = await run_both_policies(registry, server.url, config.session_keys, slugify_task, sandbox_pool)
    finally:
        server.stop_thread()
        await engine.aclose()
    check_own_policy(runs, adapters)


async def test_two_runners_each_bound_to_its_policy_on_one_engine_actor_over_session_shards(
    ray_session, tiny_model_dir, adapters, slugify_task, sandbox_pool
):
    """Across processes: ``RayEngineClient.policy`` views of one engine actor, session shards, Ray Serve."""
    import ray
    from ray import serve

    from components.engine.embedded import EmbeddedEngineConfig
    from components.engine.providers import EmbeddedEngineBrickConfig
    from components.engine.ray_actor import RayEngineClient, start_engine_actor
    from components.proxy.config import ProxyConfig
    from components.proxy.ray_sessions import start_session_shards
    from components.proxy.serve import run_proxy_on_serve

    (_, alice_adapter), (_, bob_adapter) = adapters
    settings = EmbeddedEngineBrickConfig(num_cpus=0)
    actor = start_engine_actor(
        EmbeddedEngineConfig(model_path=tiny_model_dir, settings=settings, eos_token_ids=())
    )
    engine = await RayEngineClient.connect(actor)
    alice, bob = engine.policy("alice"), engine.policy("bob")
    assert alice.weight_version == bob.weight_version == 0  # no adapter yet: the engine's initial version
    await alice.update_adapter(alice_adapter, 5)
    await bob.update_adapter(bob_adapter, 9)
    assert (alice.weight_version, bob.weight_version, engine.weight_version) == (5, 9, 0)
    assert await engine.refresh_policy("alice") == 5

    config = ProxyConfig(default_max_tokens=MAX_TOKENS)
    registry = start_session_shards(
        engine, tiny_model_dir, config, num_shards=2, policies={"alice": alice, "bob": bob}
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app_name = "rein-policies-test"
    try:
        url = run_proxy_on_serve(
            registry, config, app_name=app_name, route_prefix="/policies", num_replicas=1
        )
        runs = await run_both_policies(registry, url, config.session_keys, slugify_task, sandbox_pool)
    finally:
        serve.delete(app_name)
        registry.shutdown()
        ray.kill(actor)
    check_own_policy(runs, adapters)


def test_runner_policy_name_is_validated():
    with pytest.raises(ValueError, match="policy"):
        RolloutConfig(policy="alice/../bob")
