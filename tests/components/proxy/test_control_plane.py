"""The proxy's control plane is out of reach of the agents (issue #17.1).

An agent in a real bubblewrap sandbox, reaching the proxy through the sandbox's proxy path and holding only
what a harness gives it (its session's token), tries every control route with the official SDKs and plain
HTTP. Against the isolated proxy (``ProxyConfig.admin_key``) only its own session's model routes answer;
against the weakened variant (shared-key mode, the one key handed to the agent) the same attacks succeed, so
the test can fail. ``ProxyConfig()`` itself is closed (issue #28.8): its weakened variant is the explicit
``insecure_open_control_plane`` opt-out.
"""

from __future__ import annotations

import json
import sys

import anthropic
import httpx
import openai
import pytest

from components.engine.scripted_policies import tool_call
from components.protocols import SandboxSpec
from components.proxy.auth import SessionKeys, generate_admin_key
from components.proxy.config import ProxyConfig
from components.proxy.errors import SessionNotFoundError
from components.rollout.runner import RolloutConfig, RolloutRunner
from components.tasks.swe import python_tool_paths
from components.tasks.toys import TicTacToeEnv
from components.trajectory import TrajectoryStatus
from harnesses.toy_agent import ToyAgentConfig, ToyAgentHarness, ToyGameTask

# Runs inside the sandbox with the host's interpreter (bound read-only); the project itself is not there.
ATTACK_SCRIPT = r"""
import json, os, sys
import anthropic, httpx, openai

root, own, other, key = (os.environ[name] for name in ("ROOT", "OWN", "OTHER", "KEY"))
results = {}

def record(name, call):
    try:
        call()
        results[name] = 200
    except (openai.APIStatusError, anthropic.APIStatusError) as error:
        results[name] = error.status_code

def http(name, method, url, **kwargs):
    response = httpx.request(method, url, headers={"Authorization": f"Bearer {key}"}, timeout=30, **kwargs)
    results[name] = response.status_code

chat = dict(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
record("own_chat", lambda: openai.OpenAI(base_url=f"{root}/s/{own}/v1", api_key=key, max_retries=0)
       .chat.completions.create(**chat))
record("own_messages", lambda: anthropic.Anthropic(base_url=f"{root}/s/{own}", api_key=key, max_retries=0)
       .messages.create(**chat))
record("other_chat", lambda: openai.OpenAI(base_url=f"{root}/s/{other}/v1", api_key=key, max_retries=0)
       .chat.completions.create(**chat))
record("other_via_header", lambda: openai.OpenAI(base_url=f"{root}/v1", api_key=key, max_retries=0,
       default_headers={"X-Session-Id": other}).chat.completions.create(**chat))
http("own_trajectory", "GET", f"{root}/s/{own}/trajectory")
http("other_trajectory", "GET", f"{root}/s/{other}/trajectory")
http("open_session", "POST", f"{root}/sessions", json={"task_id": "forged"})
http("health", "GET", f"{root}/health")
http("discard_other", "POST", f"{root}/s/{other}/discard")
http("finalize_own", "POST", f"{root}/s/{own}/finalize", json={"reward": 1.0, "status": "ok"})
print(json.dumps(results))
"""


def first_free_cell(prompt: str) -> str:
    """A policy that plays the first free cell of the last board in the prompt (always legal)."""
    rows = [line for line in prompt.splitlines() if line[:3] in ("A  ", "B  ", "C  ")][-3:]
    index = [cell.strip() for row in rows for cell in row[3:].split("|")].index("")
    return tool_call("make_move", cell=f"{'ABC'[index // 3]}{index % 3 + 1}")


CONTROL_ATTACKS = (
    "other_chat",
    "other_via_header",
    "own_trajectory",
    "other_trajectory",
    "open_session",
    "health",
    "discard_other",
    "finalize_own",
)


async def _attack_from_sandbox(
    sandbox_factory, proxy, own: str, other: str, *, agent_key: str
) -> dict[str, int]:
    spec = SandboxSpec(proxy_url=proxy.url, read_only_paths=python_tool_paths())
    sandbox = await sandbox_factory(spec)
    try:
        await sandbox.write_file("attack.py", ATTACK_SCRIPT)
        result = await sandbox.exec(
            [sys.executable, "attack.py"],
            env={"ROOT": proxy.url, "OWN": own, "OTHER": other, "KEY": agent_key},
            timeout_s=120,
        )
    finally:
        await sandbox.close()
    assert result.exit_code == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def sandbox_factory():
    from sandboxes.bwrap import BwrapSandbox

    return BwrapSandbox.create


def _runner(proxy, keys: SessionKeys | None) -> RolloutRunner:
    """The runner hands each harness ``session_api_key(session_id)``; nothing else reaches the agent."""
    return RolloutRunner(
        RolloutConfig(),
        harness=None,
        sandboxes=None,
        sessions=proxy.registry,
        proxy_url=proxy.url,
        grader=None,
        session_keys=keys,
    )


async def test_agent_with_its_session_token_reaches_only_its_own_model_routes(start_proxy, sandbox_factory):
    keys = SessionKeys.generate()
    proxy = start_proxy(admin_key=keys.admin_key)
    own = proxy.open_session(task_id="victim-task")
    other = proxy.open_session(task_id="neighbour-task")
    agent_key = _runner(proxy, keys).session_api_key(own)
    assert agent_key == keys.session_token(own) and keys.admin_key not in agent_key

    results = await _attack_from_sandbox(sandbox_factory, proxy, own, other, agent_key=agent_key)
    assert results["own_chat"] == results["own_messages"] == 200, results
    assert {name: results[name] for name in CONTROL_ATTACKS} == dict.fromkeys(CONTROL_ATTACKS, 401), results
    # Nothing changed on the host: both sessions open and unfinalized, the other one untouched.
    assert proxy.describe(own).num_turns == 2
    assert proxy.describe(other).num_turns == 0

    # With a made-up key, or with the token of a third session, not even the own model routes answer.
    third_token = keys.session_token(proxy.open_session())
    for key in ("not-a-token", third_token):
        results = await _attack_from_sandbox(sandbox_factory, proxy, own, other, agent_key=key)
        assert set(results.values()) == {401}, results


async def test_weakened_shared_key_proxy_lets_the_same_attacks_through(start_proxy, sandbox_factory):
    proxy = start_proxy(api_key="one-shared-key")
    own = proxy.open_session(task_id="victim-task")
    other = proxy.open_session(task_id="neighbour-task")
    agent_key = "one-shared-key"  # what a harness has to hand its agent in this mode
    results = await _attack_from_sandbox(sandbox_factory, proxy, own, other, agent_key=agent_key)
    assert {name: results[name] for name in ("own_chat", *CONTROL_ATTACKS)} == dict.fromkeys(
        ("own_chat", *CONTROL_ATTACKS), 200
    ), results
    with pytest.raises(SessionNotFoundError):
        proxy.describe(own)  # the agent finalized its own session (with reward 1.0) from inside
    with pytest.raises(SessionNotFoundError):
        proxy.describe(other)  # and discarded its neighbour's


@pytest.mark.parametrize("open_plane", [False, True], ids=["default-closed", "weakened-insecure-open"])
async def test_default_config_is_closed_to_an_agent_without_a_token(start_proxy, sandbox_factory, open_plane):
    """Secure by default (issue #28.8): ``ProxyConfig()`` with no key at all generates one, so an agent that
    was handed no token (what a runner without the proxy's keys gives it) reaches no route, not even its own
    session. The named opt-out ``insecure_open_control_plane`` is the weakened variant: the same attacks land."""
    proxy = start_proxy(insecure_open_control_plane=open_plane)  # else every field at its default
    assert (proxy.server.config.session_keys is None) == open_plane
    own = proxy.open_session(task_id="victim-task")
    other = proxy.open_session(task_id="neighbour-task")
    agent_key = _runner(proxy, None).session_api_key(own)  # the placeholder a harness gets without keys
    results = await _attack_from_sandbox(sandbox_factory, proxy, own, other, agent_key=agent_key)
    if open_plane:
        assert {name: results[name] for name in ("own_chat", *CONTROL_ATTACKS)} == dict.fromkeys(
            ("own_chat", *CONTROL_ATTACKS), 200
        ), results
        with pytest.raises(SessionNotFoundError):
            proxy.describe(own)  # finalized from inside the sandbox
    else:
        assert set(results.values()) == {401}, results
        assert proxy.describe(own).num_turns == 0 and proxy.describe(other).num_turns == 0


def test_default_config_generates_a_host_only_admin_key():
    first, second = ProxyConfig(), ProxyConfig()
    assert first.session_keys is not None and first.admin_key != second.admin_key
    assert first.admin_key not in repr(first)
    assert ProxyConfig(api_key="shared").admin_key is None  # shared-key mode stays an explicit choice
    with pytest.raises(ValueError, match="insecure_open_control_plane"):
        ProxyConfig(insecure_open_control_plane=True, admin_key=generate_admin_key())


def test_host_with_the_admin_key_drives_the_sessions_over_http(start_proxy):
    admin_key = generate_admin_key()
    proxy = start_proxy(admin_key=admin_key)
    admin = {"Authorization": f"Bearer {admin_key}"}
    assert httpx.get(f"{proxy.url}/health", headers=admin).status_code == 200
    assert httpx.get(f"{proxy.url}/health").status_code == 401
    opened = httpx.post(f"{proxy.url}/sessions", headers=admin, json={"task_id": "t"}).json()
    token = opened["api_key"]
    assert token == SessionKeys(admin_key=admin_key).session_token(opened["session_id"])
    reply = openai.OpenAI(base_url=opened["base_url"] + "/v1", api_key=token).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content
    models = openai.OpenAI(base_url=opened["base_url"] + "/v1", api_key=token).models.list()
    assert [model.id for model in models.data] == ["rein-policy"]
    with pytest.raises(openai.AuthenticationError):  # the admin key is not a session token
        openai.OpenAI(base_url=opened["base_url"] + "/v1", api_key=admin_key).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(anthropic.AuthenticationError):  # a token of another session id
        anthropic.Anthropic(
            base_url=opened["base_url"], api_key=SessionKeys(admin_key=admin_key).session_token("other")
        ).messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    # a process reward per model call (turn-level credit): one call was made, so one reward, numbers only
    for bad, message in (([1.0, 2.0], "2 rewards for 1 turns"), (["x"], "body.turn_rewards[0]")):
        refused = httpx.post(f"{opened['base_url']}/finalize", headers=admin, json={"turn_rewards": bad})
        assert refused.status_code == 400 and message in refused.text, refused.text
    trajectory = httpx.post(
        f"{opened['base_url']}/finalize",
        headers=admin,
        json={"reward": 0.5, "status": "ok", "turn_rewards": [0.25]},
    )
    assert trajectory.status_code == 200 and trajectory.json()["reward"] == 0.5
    assert [s["turn_rewards"] for s in trajectory.json()["segments"]] == [[0.25]]
    # After finalize the token opens nothing: the session is gone.
    gone = httpx.post(
        f"{opened['base_url']}/v1/chat/completions",
        headers={"Authorization": f"Bearer {token}"},
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert gone.status_code == 404


def test_admin_key_config_is_validated():
    with pytest.raises(ValueError, match="admin_key"):
        ProxyConfig(admin_key="short")
    with pytest.raises(ValueError, match="api_key"):
        ProxyConfig(admin_key=generate_admin_key(), api_key="shared")
    assert "x" * 32 not in repr(ProxyConfig(admin_key="x" * 32))


class _FreshSandboxes:
    """A brand-new bwrap sandbox per rollout."""

    def __init__(self, factory) -> None:
        self.factory = factory

    async def acquire(self, spec):
        return await self.factory(spec)

    async def release(self, sandbox) -> None:
        await sandbox.close()


@pytest.mark.parametrize("hand_out_tokens", [True, False], ids=["session-tokens", "weakened-no-tokens"])
async def test_runner_hands_each_harness_its_session_token(start_proxy, sandbox_factory, hand_out_tokens):
    """End to end through the real runner and the toy harness (OpenAI SDK): with the proxy's keys the
    rollouts play and are graded; a runner that does not hand out tokens is refused by the isolated proxy."""
    keys = SessionKeys.generate()
    proxy = start_proxy(admin_key=keys.admin_key, script=first_free_cell)
    harness = ToyAgentHarness(ToyAgentConfig(max_turns=10))
    runner = RolloutRunner(
        RolloutConfig(group_size=2, max_concurrency=2),
        harness=harness,
        sandboxes=_FreshSandboxes(sandbox_factory),
        sessions=proxy.registry,
        proxy_url=proxy.url,
        grader=harness.reward,
        session_keys=keys if hand_out_tokens else None,
    )
    task = ToyGameTask(task_id="tictactoe-0", make_env=TicTacToeEnv, seed=0)
    trajectories = await runner.run([task], step=0)
    statuses = {trajectory.status for trajectory in trajectories}
    if hand_out_tokens:
        assert statuses == {TrajectoryStatus.OK}, [t.failure_reason for t in trajectories]
        assert all(trajectory.metrics["num_moves"] >= 3 for trajectory in trajectories)
    else:
        assert TrajectoryStatus.OK not in statuses
        assert all("401" in t.log or "session token" in t.log for t in trajectories), trajectories[0].log


@pytest.mark.slow
async def test_isolated_proxy_on_ray_serve_replicas(ray_session, tokenizer, default_model_dir):
    """The same checks hold on Serve replicas over session shards: tokens are verified with the key alone."""
    import socket

    from ray import serve

    from components.engine.scripted import ScriptedEngine
    from components.proxy.ray_sessions import start_session_shards
    from components.proxy.serve import run_proxy_on_serve

    keys = SessionKeys.generate()
    config = ProxyConfig(admin_key=keys.admin_key)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    registry = start_session_shards(
        ScriptedEngine(tokenizer, ["ok"]), default_model_dir, config, num_shards=2
    )
    app_name = "rein-control-plane-test"
    try:
        url = run_proxy_on_serve(registry, config, app_name=app_name, route_prefix="/cp", num_replicas=2)
        own, other = [await registry.open_session() for _ in range(2)]
        async with openai.AsyncOpenAI(
            base_url=f"{url}/s/{own}/v1", api_key=keys.session_token(own), max_retries=0
        ) as client:
            for _ in range(4):  # several requests, so both replicas answer some
                reply = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
                assert reply.choices[0].message.content == "ok"
        async with openai.AsyncOpenAI(
            base_url=f"{url}/s/{other}/v1", api_key=keys.session_token(own), max_retries=0
        ) as client:
            with pytest.raises(openai.AuthenticationError):
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        token = {"Authorization": f"Bearer {keys.session_token(own)}"}
        admin = {"Authorization": f"Bearer {keys.admin_key}"}
        async with httpx.AsyncClient(timeout=30) as http:
            for method, path in (
                ("POST", "/sessions"),
                ("GET", f"/s/{own}/trajectory"),
                ("POST", f"/s/{own}/finalize"),
                ("POST", f"/s/{other}/discard"),
                ("GET", "/health"),
            ):
                assert (await http.request(method, url + path, headers=token)).status_code == 401, path
            assert (await http.get(f"{url}/health", headers=admin)).status_code == 200
            finalized = await http.post(f"{url}/s/{own}/finalize", headers=admin, json={"reward": 1.0})
            assert finalized.status_code == 200 and finalized.json()["reward"] == 1.0
            assert finalized.json()["trajectory_id"] == own
    finally:
        serve.delete(app_name)
        registry.shutdown()
