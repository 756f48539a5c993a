"""SGLang's logprobs under truncated sampling: what the server returns, and why Rein refuses top-p / top-k with it.

SGLang 0.5.x samples with top-p / top-k but returns ``log_softmax(logits / temperature)`` of the whole vocabulary
(never renormalised over the kept tokens); Rein's trainer recomputes logprobs under the truncated, renormalised
distribution (``components/sampling.py``). The fake server behaves as SGLang does, so the mismatch is measurable
here, and the client's refusal is what keeps it out of training."""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
from components.engine.providers import SGLangBrickConfig
from components.engine.sglang import SGLangEngine, SGLangEngineConfig, TruncatedSamplingError
from components.protocols import SamplingParams
from components.proxy.errors import classify_error
from components.recipe_config import parse_config
from components.run.config import RunConfig, SamplingBrickConfig
from components.sampling import sampling_logprobs
from tests.components.engine.fake_sglang import FakeSGLangServer

pytestmark = pytest.mark.timeout(180)

PROMPT = [5, 6, 7, 8, 9, 10]


@pytest.fixture(scope="module")
def fake_server(tiny_model_dir):
    engine = EmbeddedEngine(
        EmbeddedEngineConfig(model_path=tiny_model_dir, context_window=512, eos_token_ids=())
    )
    with FakeSGLangServer(engine, tiny_model_dir) as server:
        yield server
    engine.close()


def trainer_logprobs(
    engine: EmbeddedEngine, output_ids: list[int], *, temperature, top_p, top_k
) -> list[float]:
    """What Rein's trainer computes for the sampled tokens: the truncated, renormalised distribution."""
    ids = torch.tensor([PROMPT + output_ids])
    with torch.no_grad():
        logits = engine.model(input_ids=ids, use_cache=False).logits[0, len(PROMPT) - 1 : -1].float()
    rows = len(output_ids)
    targets = torch.tensor(output_ids)
    logprobs = sampling_logprobs(
        logits,
        temperature=torch.full((rows,), float(temperature)),
        top_p=torch.full((rows,), float(top_p)),
        top_k=torch.full((rows,), int(top_k)),
        keep_tokens=targets,
    )
    return logprobs.gather(1, targets[:, None])[:, 0].tolist()


def test_sglang_logprobs_miss_the_truncated_distribution(fake_server):
    """The weakened path (a client that passes top-p / top-k through): SGLang's logprobs disagree with the
    trainer's by log(kept mass), which is exactly the silent error the refusal prevents."""
    sampling = {"max_new_tokens": 12, "temperature": 0.8, "top_p": 0.6, "top_k": 8, "sampling_seed": 3}
    body = {"input_ids": PROMPT, "sampling_params": sampling, "return_logprob": True, "logprob_start_len": -1}
    reply = httpx.post(f"{fake_server.url}/generate", json=body, timeout=60).json()
    output_ids = reply["output_ids"]
    returned = [entry[0] for entry in reply["meta_info"]["output_token_logprobs"]]
    assert len(output_ids) == 12
    engine = fake_server.state.engine
    truncated = trainer_logprobs(engine, output_ids, temperature=0.8, top_p=0.6, top_k=8)
    untruncated = trainer_logprobs(engine, output_ids, temperature=0.8, top_p=1.0, top_k=0)
    # As SGLang: the returned logprobs are those of the untruncated softmax(logits / T) ...
    assert max(abs(a - b) for a, b in zip(returned, untruncated, strict=True)) <= 1e-4
    # ... so each is below the trainer's by -log(kept mass) > 0, and some by a lot.
    gaps = [t - r for t, r in zip(truncated, returned, strict=True)]
    assert all(gap >= -1e-4 for gap in gaps)
    assert max(gaps) > math.log(1 / 0.6) - 1e-3  # top_p=0.6 keeps at most ~0.6 + one token's mass


async def test_client_refuses_truncated_sampling_before_any_request(fake_server):
    state = fake_server.state
    state.requests.clear()
    client = await SGLangEngine.connect(SGLangEngineConfig.for_url(fake_server.url))
    try:
        for params in (SamplingParams(max_tokens=4, top_p=0.9), SamplingParams(max_tokens=4, top_k=5)):
            with pytest.raises(TruncatedSamplingError, match=r"--top-p 1 --top-k 0"):
                await client.generate(PROMPT, params)
        assert not [path for path, _ in state.requests if path == "/generate"]
        # An agent's truncating request through the proxy is a client error (400), not an engine failure.
        assert classify_error(TruncatedSamplingError("top_p"))[0] == 400
        # Temperature alone is fine: SGLang's logprobs are then exactly the trainer's distribution.
        result = await client.generate(PROMPT, SamplingParams(max_tokens=10, temperature=0.7, seed=2))
        (body,) = [json.loads(body) for path, body in state.requests if path == "/generate"]
        assert body["sampling_params"]["top_p"] == 1.0 and body["sampling_params"]["top_k"] == -1
        expected = trainer_logprobs(
            state.engine, list(result.output_ids), temperature=0.7, top_p=1.0, top_k=0
        )
        assert max(abs(a - b) for a, b in zip(result.logprobs, expected, strict=True)) <= 1e-4
    finally:
        await client.aclose()


def test_run_config_refuses_truncated_sampling_with_sglang(capsys):
    sglang = {
        "model": "tiny",
        "engine": SGLangBrickConfig(url="http://127.0.0.1:9"),
    }
    for truncation in ({"top_p": 0.95}, {"top_k": 50}):
        with pytest.raises(TruncatedSamplingError, match=r"--top-p / --top-k: top_p="):
            RunConfig(**sglang, sampling=SamplingBrickConfig(**truncation))
    flags = ["--model", "tiny", "--engine", "sglang", "--sglang-url", "http://127.0.0.1:9"]
    with pytest.raises(SystemExit):  # the recipe's command line says which flags to change
        parse_config(RunConfig, [*flags, "--top-p", "0.9"])
    assert "--top-p 1 --top-k 0" in capsys.readouterr().err
    assert parse_config(RunConfig, [*flags, "--temperature", "0.6"]).sampling.temperature == 0.6
    # The embedded engine records logprobs under the truncated distribution itself: allowed there.
    assert RunConfig(
        model="tiny", sampling=SamplingBrickConfig(top_p=0.95, top_k=50)
    ).sampling.distribution.truncates
