"""Distillation teachers served by an inference server: ``distillation.teachers`` entries ``vllm:URL`` or
``sglang:URL`` (beside model folders, which run as embedded engines). The server client's own
``logprobs_of`` scores the student's tokens teacher-forced (vLLM: ``/v1/completions`` with ``prompt_logprobs``;
SGLang: a prefill-only ``/generate``), so a server teacher is a ``TeacherScorer`` like the embedded engine.

The tokenizer check runs against what the server says it serves: its tokenizer folder when this machine can
read it (vLLM's model card ``root``, SGLang's ``/model_info`` ``tokenizer_path``), else (vLLM) the server's own
``/tokenize`` of probe texts against the policy's tokenizer; a teacher that cannot be checked is a config error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from components.training.distillation import require_same_tokenizer

if TYPE_CHECKING:
    from components.engine.sglang import SGLangEngine
    from components.engine.vllm import VLLMEngine

# a teacher-forced probe of the vocabulary: words, digits, code, whitespace and non-ASCII text
PROBE_TEXTS = (
    "The quick brown fox, 12345 + 678 = ?",
    "def f(x):\n    return x ** 2  # ok",
    "naïve café ✓ 東京",
)


def server_kind(spec: str) -> str | None:
    """``vllm`` / ``sglang`` for a server teacher spec (``KIND:http(s)://...``), None for a model folder."""
    kind, _, url = spec.partition(":")
    return kind if kind in SERVER_TEACHERS and url.startswith(("http://", "https://")) else None


async def connect_server_teacher(
    spec: str, *, policy_model: Path, field: str = "distillation.teachers"
) -> VLLMEngine | SGLangEngine:
    """The server client of ``spec``, connected, with its tokenizer checked against the policy's."""
    kind, _, url = spec.partition(":")
    return await SERVER_TEACHERS[kind](url, Path(policy_model), field)


async def _vllm(url: str, policy_model: Path, field: str) -> VLLMEngine:
    from components.engine.vllm import VLLMEngine, VLLMEngineConfig

    engine = await VLLMEngine.connect(VLLMEngineConfig.for_url(url, logprobs_mode="processed_logprobs"))
    try:
        cards = (await engine._request("GET", "/v1/models")).get("data") or [{}]
        folder = Path(str(cards[0].get("root") or ""))
        if folder.is_dir():
            require_same_tokenizer(policy_model, folder, field=field)
        else:
            await _require_same_tokenization(engine, policy_model, field, url)
    except BaseException:
        await engine.aclose()
        raise
    return engine


async def _require_same_tokenization(engine: VLLMEngine, policy_model: Path, field: str, url: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy_model)
    for text in PROBE_TEXTS:
        reply = await engine._request("POST", "/tokenize", json={"prompt": text, "add_special_tokens": False})
        own = tokenizer.encode(text, add_special_tokens=False)
        if reply.get("tokens") != own:
            raise ValueError(
                f"{field}: the vLLM teacher {url} tokenizes {text!r} as {reply.get('tokens')}, the policy as "
                f"{own}; a teacher scores the student's token ids, so it needs the same tokenizer"
            )


async def _sglang(url: str, policy_model: Path, field: str) -> SGLangEngine:
    from components.engine.sglang import SGLangEngine, SGLangEngineConfig

    engine = await SGLangEngine.connect(SGLangEngineConfig.for_url(url))
    try:
        info = await engine._request("GET", "/model_info")
        folder = Path(str(info.get("tokenizer_path") or info.get("model_path") or ""))
        if not folder.is_dir():
            raise ValueError(
                f"{field}: cannot check the tokenizer of the SGLang teacher {url}: its tokenizer_path "
                f"{str(folder)!r} is not a folder this machine can read (mount it at the same path)"
            )
        require_same_tokenizer(policy_model, folder, field=field)
    except BaseException:
        await engine.aclose()
        raise
    return engine


SERVER_TEACHERS: dict[str, Callable[[str, Path, str], Awaitable[VLLMEngine | SGLangEngine]]] = {
    "vllm": _vllm,
    "sglang": _sglang,
}
