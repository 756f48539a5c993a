"""``rein view RUN_DIR``: the trajectory viewer of a run, as one static, self-contained HTML page.

The page (``RUN_DIR/viewer/index.html`` by default) embeds the run's trajectories as JSON and renders them with
inline JavaScript - no CDN, no server needed: a table with filters (status, reward range, task, harness, text),
and for the opened trajectory (``index.html#t=<trajectory_id>``) its conversation (messages, tool calls and
their outputs), its tokens coloured by loss mask or by |train − rollout| logprob difference (when
``RUN_DIR/train_logprobs/*.parquet`` exists), segment boundaries with their reasons, and the harness/grading
log. Token ids are decoded with the run's tokenizer (``--model`` or the model named in
``RUN_DIR/config.json``); without one the page shows ids. Sizes are capped (``ViewerLimits``) so the page
stays loadable for big runs; every cut says what was left out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import logging
import math
import os
import sys
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from components.config import require_positive
from components.trajectory import Trajectory
from components.trajectory_store import SHARD_SUFFIX, TEMP_PREFIX, TrajectoryStore
from monitoring.train_logprobs import read_train_logprobs

logger = logging.getLogger(__name__)

VIEWER_DIR_NAME = "viewer"
PAGE_FILE_NAME = "index.html"
TEMPLATE_PATH = Path(__file__).with_name("viewer_template.html")
DATA_PLACEHOLDER = "/*__REIN_VIEWER_DATA__*/"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass(frozen=True, kw_only=True)
class ViewerLimits:
    """Caps that keep the page loadable (tens of MB at most); whatever is cut is said on the page.
    Page-wide budgets go to the most recent steps first."""

    max_trajectories: int = 5_000  # listed trajectories (the most recent steps are kept)
    max_tokens_per_trajectory: int = 4_096  # embedded tokens per trajectory (later tokens are cut)
    max_total_tokens: int = 300_000  # embedded tokens per page
    max_message_chars: int = 8_000  # characters per message content or tool-call arguments
    max_conversation_chars: int = (
        100_000  # characters of conversation per trajectory (later messages are cut)
    )
    max_log_chars: int = 20_000  # characters of log per trajectory (head and tail are kept)
    max_total_text_chars: int = 12_000_000  # characters of conversation + log per page

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            require_positive(value, name)


# ----------------------------------------------------------------------------------------------------------
# Reading the run
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RunContents:
    trajectories: list[Trajectory]
    unreadable_shards: list[str]  # "path: error" for each shard that could not be read


def read_run(run_dir: Path) -> RunContents:
    """Every readable trajectory of ``run_dir``; never modifies the run (a live run may be writing)."""
    # Not ``TrajectoryStore(run_dir)``: opening a store removes temp shards, which would break a live writer.
    directory = run_dir / "trajectories"
    paths = (
        sorted(p for p in directory.glob(f"*{SHARD_SUFFIX}") if not p.name.startswith(TEMP_PREFIX))
        if directory.is_dir()
        else []
    )
    trajectories: list[Trajectory] = []
    unreadable: list[str] = []
    for path in paths:
        try:
            trajectories.extend(TrajectoryStore.read_shard(path))
        except Exception as error:  # a corrupt shard is reported on the page, never fatal
            logger.warning("skipping unreadable trajectory shard %s: %s", path, error)
            unreadable.append(f"{path.name}: {type(error).__name__}: {error}")
    return RunContents(trajectories=trajectories, unreadable_shards=unreadable)


# ----------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------


def _model_candidates(value: Any, key: str = "") -> Iterator[str]:
    """String values of ``config.json`` that may name the policy model (keys mentioning model/tokenizer)."""
    lowered = key.lower()
    if isinstance(value, str) and ("model" in lowered or "tokenizer" in lowered):
        yield value
    elif isinstance(value, Mapping):
        for child_key, child in value.items():
            if isinstance(child, str) and child_key in ("path", "name", "dir") and "model" in lowered:
                yield child
            yield from _model_candidates(child, str(child_key))
    elif isinstance(value, list):
        for child in value:
            yield from _model_candidates(child, key)


def _tokenizer_dir(candidate: str, run_dir: Path) -> Path | None:
    from components.models.registry import DEFAULT_MODEL_NAME, MODELS_DIR, TINY_MODEL_NAME, default_model_dir

    if candidate in ("default", DEFAULT_MODEL_NAME):
        paths = [default_model_dir()]
    elif candidate == TINY_MODEL_NAME:  # the tiny model is built with the default model's tokenizer
        paths = [MODELS_DIR / TINY_MODEL_NAME, default_model_dir()]
    else:
        paths = [Path(candidate), run_dir / candidate]
    return next((p for p in paths if p.is_dir() and any((p / f).exists() for f in TOKENIZER_FILES)), None)


def find_model_dir(run_dir: Path) -> Path | None:
    """The tokenizer folder named by ``RUN_DIR/config.json`` (its model path), or None."""
    config_path = run_dir / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    for candidate in _model_candidates(config):
        found = _tokenizer_dir(candidate, run_dir)
        if found is not None:
            return found
    return None


def load_tokenizer(model: Path | str) -> Any:
    """An HF tokenizer from a model folder (local files only)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model), local_files_only=True)


def decode_vocabulary(tokenizer: Any, token_ids: set[int]) -> dict[str, str]:
    """Each id's text on its own (a byte of a multi-byte character shows as '�')."""
    ids = sorted(token_ids)
    vocab_size = len(tokenizer)
    valid = [i for i in ids if 0 <= i < vocab_size]
    texts = tokenizer.batch_decode([[i] for i in valid], skip_special_tokens=False) if valid else []
    out = {str(i): text for i, text in zip(valid, texts, strict=True)}
    out.update({str(i): f"<{i}?>" for i in ids if not 0 <= i < vocab_size})
    return out


# ----------------------------------------------------------------------------------------------------------
# Page data
# ----------------------------------------------------------------------------------------------------------


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… [{len(text) - limit} more characters not shown]"


def _truncate_middle(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit // 2
    return (
        text[:head]
        + f"\n… [{len(text) - limit} characters not shown] …\n"
        + text[len(text) - (limit - head) :]
    )


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts
        return "\n".join(
            part.get("text", json.dumps(part)) if isinstance(part, Mapping) else str(part) for part in content
        )
    if content is not None and not isinstance(content, str):
        return json.dumps(content)
    return content or ""


def _page_message(message: Any, limit: int) -> dict[str, Any]:
    """One message as the page shows it, every text field capped at ``limit`` characters."""
    if not isinstance(message, Mapping):
        return {"role": "?", "content": _truncate(json.dumps(message), limit)}
    page_message: dict[str, Any] = {
        "role": str(message.get("role", "?")),
        "content": _truncate(_message_text(message), limit),
    }
    for key in ("tool_call_id", "name", "reasoning", "reasoning_content"):
        if message.get(key):
            page_message[key] = _truncate(str(message[key]), limit)
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function", {}) if isinstance(call, Mapping) else {}
        arguments = function.get("arguments", "")
        calls.append(
            {
                "id": str(call.get("id", "")) if isinstance(call, Mapping) else "",
                "name": str(function.get("name", "?")),
                "arguments": _truncate(
                    arguments if isinstance(arguments, str) else json.dumps(arguments), limit
                ),
            }
        )
    if calls:
        page_message["tool_calls"] = calls
    return page_message


def _message_chars(message: Mapping[str, Any]) -> int:
    return sum(len(v) for v in message.values() if isinstance(v, str)) + sum(
        len(c["arguments"]) + len(c["name"]) for c in message.get("tool_calls", ())
    )


def _page_messages(
    messages_json: str, *, budget_chars: int, limits: ViewerLimits
) -> tuple[list[dict[str, Any]], str, int]:
    """The conversation as the page shows it, within ``budget_chars``: (messages, error text, chars used).
    Messages past the budget are replaced by one note saying how many were left out."""
    try:
        messages = json.loads(messages_json)
    except json.JSONDecodeError as error:
        return [], f"messages_json is not valid JSON: {error}", 0
    if not isinstance(messages, list):
        return [], f"messages_json is a {type(messages).__name__}, not a list", 0
    out: list[dict[str, Any]] = []
    used = 0
    for index, message in enumerate(messages):
        page_message = _page_message(message, min(limits.max_message_chars, max(budget_chars - used, 0)))
        size = _message_chars(page_message)
        if used + size > budget_chars and out:
            left = len(messages) - index
            out.append({"role": "note", "content": f"… {left} more messages not embedded (viewer size caps)"})
            break
        out.append(page_message)
        used += size
    return out, "", used


def _aligned_train_logprobs(train: np.ndarray | None, loss_mask: np.ndarray) -> np.ndarray | None:
    """Train logprobs per token position (given per token, or per sampled token only)."""
    if train is None:
        return None
    if len(train) == len(loss_mask):
        return train
    if len(train) == int(loss_mask.sum()):
        aligned = np.zeros(len(loss_mask), dtype=np.float64)
        aligned[loss_mask == 1] = train
        return aligned
    logger.warning("train logprobs have %d entries for %d tokens; ignoring them", len(train), len(loss_mask))
    return None


def _rounded(values: np.ndarray) -> list[float]:
    return [round(float(v), 4) for v in values]


def _page_trajectory(
    trajectory: Trajectory,
    *,
    token_budget: int,
    text_budget: int,
    train_logprobs: Mapping[tuple[str, int], np.ndarray],
    limits: ViewerLimits,
    used_ids: set[int],
) -> dict[str, Any]:
    """One trajectory as the page's JSON; embeds at most ``token_budget`` tokens and about ``text_budget``
    characters of conversation and log."""
    messages, messages_error, conversation_chars = _page_messages(
        trajectory.messages_json, budget_chars=min(limits.max_conversation_chars, text_budget), limits=limits
    )
    log = _truncate_middle(
        trajectory.log, max(0, min(limits.max_log_chars, text_budget - conversation_chars))
    )
    segments = []
    remaining = token_budget
    differences: list[float] = []
    for index, segment in enumerate(trajectory.segments):
        shown = min(len(segment.token_ids), remaining)
        remaining -= shown
        train = _aligned_train_logprobs(
            train_logprobs.get((trajectory.trajectory_id, index)), segment.loss_mask
        )
        ids = segment.token_ids[:shown]
        used_ids.update(int(i) for i in ids)
        mask = segment.loss_mask[:shown]
        page_segment: dict[str, Any] = {
            "reason": segment.reason.value,
            "parent": segment.parent_segment,
            "branch_position": segment.branch_position,
            "branch_kind": segment.branch_kind.value,
            "num_tokens": int(len(segment.token_ids)),
            "num_sampled": segment.num_sampled_tokens,
            "ids": [int(i) for i in ids],
            "mask": "".join("1" if m else "0" for m in mask),
            "lp": _rounded(segment.logprobs[:shown]),
            "wv": [int(v) for v in segment.weight_versions[:shown]],
        }
        if train is not None:
            page_segment["tlp"] = _rounded(train[:shown])
            sampled = segment.loss_mask == 1
            differences.extend(np.abs(train[sampled] - segment.logprobs[sampled]).tolist())
        segments.append(page_segment)
    total_tokens = sum(len(s.token_ids) for s in trajectory.segments)
    turns = trajectory.metrics.get("turns")
    if turns is None:
        turns = sum(1 for m in messages if m.get("role") == "assistant")
    return {
        "id": trajectory.trajectory_id,
        "group": trajectory.group_id,
        "task": trajectory.task_id,
        "harness": trajectory.harness,
        "status": trajectory.status.value,
        "failure_reason": _truncate(trajectory.failure_reason, limits.max_message_chars),
        "reward": trajectory.reward,
        "step": trajectory.step,
        "trainable": trajectory.trainable,
        "metrics": {k: (v if math.isfinite(v) else None) for k, v in sorted(trajectory.metrics.items())},
        "turns": int(turns),
        "num_segments": len(trajectory.segments),
        "num_tokens": int(total_tokens),
        "num_sampled": int(sum(s.num_sampled_tokens for s in trajectory.segments)),
        "tokens_not_shown": int(total_tokens - sum(len(s["ids"]) for s in segments)),
        "logprob_diff_mean": float(np.mean(differences)) if differences else None,
        "logprob_diff_max": float(np.max(differences)) if differences else None,
        "messages": messages,
        "messages_error": messages_error,
        "log": log,
        "text_chars": conversation_chars + len(log),
        "segments": segments,
    }


def build_page_data(
    run_dir: Path,
    *,
    tokenizer: Any = None,
    tokenizer_name: str | None = None,
    limits: ViewerLimits = ViewerLimits(),
    steps: Collection[int] | None = None,
) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready data (only ``steps`` when given)."""
    contents = read_run(run_dir)
    if steps is not None:
        wanted = set(steps)
        contents = RunContents(
            trajectories=[t for t in contents.trajectories if t.step in wanted],
            unreadable_shards=contents.unreadable_shards,
        )
    train_logprobs = read_train_logprobs(run_dir)
    # Most recent steps first, so caps drop the oldest rollouts.
    ordered = sorted(contents.trajectories, key=lambda t: (-t.step, t.task_id, t.group_id, t.trajectory_id))
    listed = ordered[: limits.max_trajectories]
    token_budget, text_budget = limits.max_total_tokens, limits.max_total_text_chars
    used_ids: set[int] = set()
    page_trajectories = []
    for trajectory in listed:
        page = _page_trajectory(
            trajectory,
            token_budget=min(limits.max_tokens_per_trajectory, token_budget),
            text_budget=text_budget,
            train_logprobs=train_logprobs,
            limits=limits,
            used_ids=used_ids,
        )
        token_budget -= page["num_tokens"] - page["tokens_not_shown"]
        text_budget = max(0, text_budget - page.pop("text_chars"))
        page_trajectories.append(page)
    vocab = decode_vocabulary(tokenizer, used_ids) if tokenizer is not None else {}
    return {
        "run": {
            "name": run_dir.resolve().name,
            "dir": str(run_dir.resolve()),
            "generated_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "tokenizer": tokenizer_name if tokenizer is not None else None,
            "has_train_logprobs": bool(train_logprobs),
            "num_trajectories": len(contents.trajectories),
            "num_listed": len(listed),
            "steps": sorted(steps) if steps is not None else None,
            "unreadable_shards": contents.unreadable_shards,
            "limits": asdict(limits),
        },
        "vocab": vocab,
        "trajectories": page_trajectories,
    }


def render_page(data: Mapping[str, Any]) -> str:
    """The HTML page with ``data`` embedded (``<`` escaped so no text can close the script element)."""
    payload = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    payload = payload.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    template = TEMPLATE_PATH.read_text(encoding="utf-8")
    if DATA_PLACEHOLDER not in template:
        raise AssertionError(f"{TEMPLATE_PATH} lost its data placeholder")
    return template.replace(DATA_PLACEHOLDER, payload)


def write_viewer(
    run_dir: Path | str,
    *,
    out: Path | str | None = None,
    model: Path | str | None = None,
    tokenizer: Any = None,
    limits: ViewerLimits = ViewerLimits(),
    steps: Collection[int] | None = None,
) -> Path:
    """Write the viewer page of ``run_dir`` (default ``RUN_DIR/viewer/index.html``) atomically; return its path.

    Tokens are decoded with ``tokenizer``, else the tokenizer of ``model``, else the model named in
    ``RUN_DIR/config.json``; without any, the page shows token ids. ``steps`` keeps only those steps' rollouts."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run_dir: {run_dir} is not a directory")
    tokenizer_name = getattr(tokenizer, "name_or_path", None) or ("given tokenizer" if tokenizer else None)
    if tokenizer is None:
        model_dir = Path(model) if model is not None else find_model_dir(run_dir)
        if model is not None and not model_dir.is_dir():
            raise FileNotFoundError(f"model: {model_dir} is not a directory")
        if model_dir is not None:
            try:
                tokenizer = load_tokenizer(model_dir)
                tokenizer_name = str(model_dir)
            except Exception as error:  # the page is still useful with ids
                logger.warning("could not load a tokenizer from %s (%s); showing token ids", model_dir, error)
    html = render_page(
        build_page_data(
            run_dir, tokenizer=tokenizer, tokenizer_name=tokenizer_name, limits=limits, steps=steps
        )
    )
    out = Path(out) if out is not None else run_dir / VIEWER_DIR_NAME / PAGE_FILE_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = out.with_name(f".{out.name}.tmp")
    try:
        temp.write_text(html, encoding="utf-8")
        os.replace(temp, out)
    finally:
        temp.unlink(missing_ok=True)
    return out


# ----------------------------------------------------------------------------------------------------------
# Serving and the command line
# ----------------------------------------------------------------------------------------------------------


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        logger.debug("viewer: " + format, *args)


def serve_viewer(page: Path | str, *, port: int = 8000, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) for the page's folder on ``host:port`` (port 0: any free port)."""
    page = Path(page)
    handler = functools.partial(_QuietHandler, directory=str(page.parent))
    return ThreadingHTTPServer((host, port), handler)


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    defaults = ViewerLimits()
    parser = argparse.ArgumentParser(
        prog="rein view",
        description="Write the trajectory viewer of a run directory as one static HTML page, and optionally serve it.",
    )
    parser.add_argument("run_dir", type=Path, help="the run directory (holds trajectories/*.parquet)")
    parser.add_argument(
        "--out", type=Path, default=None, help="where to write the page (default RUN_DIR/viewer/index.html)"
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="model folder whose tokenizer decodes tokens (default: from RUN_DIR/config.json)",
    )
    parser.add_argument(
        "--serve", action="store_true", help="serve the page over HTTP on 127.0.0.1 after writing it"
    )
    parser.add_argument(
        "--port", type=int, default=8000, help="port for --serve (0: any free port; default 8000)"
    )
    parser.add_argument(
        "--step",
        type=int,
        action="append",
        default=None,
        help="only the rollouts of this step (repeat for several; default: all steps)",
    )
    parser.add_argument(
        "--max-tokens-per-trajectory",
        type=int,
        default=defaults.max_tokens_per_trajectory,
        help=f"embedded tokens per trajectory (default {defaults.max_tokens_per_trajectory})",
    )
    parser.add_argument(
        "--max-trajectories",
        type=int,
        default=defaults.max_trajectories,
        help=f"listed trajectories, most recent steps first (default {defaults.max_trajectories})",
    )
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """``rein view RUN_DIR [--serve] [--port N] [--out PATH] [--model PATH]``."""
    try:
        args = _parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if not 0 <= args.port <= 65535:
        print(f"rein view: --port must be in 0..65535, got {args.port}", file=sys.stderr)
        return 2
    try:
        limits = ViewerLimits(
            max_tokens_per_trajectory=args.max_tokens_per_trajectory, max_trajectories=args.max_trajectories
        )
        page = write_viewer(args.run_dir, out=args.out, model=args.model, limits=limits, steps=args.step)
    except (FileNotFoundError, ValueError) as error:
        print(f"rein view: {error}", file=sys.stderr)
        return 2
    print(f"wrote {page}")
    if not args.serve:
        return 0
    try:
        server = serve_viewer(page, port=args.port)
    except OSError as error:
        print(f"rein view: cannot serve on 127.0.0.1:{args.port}: {error}", file=sys.stderr)
        return 1
    print(f"serving http://127.0.0.1:{server.server_address[1]}/{page.name}  (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
