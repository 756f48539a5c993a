"""Every command the README shows (``python recipes/X.py …``, ``rein …``, ``ray job submit …`` in its code
blocks) parses with the program's own parser, with the options and values shown (placeholders such as ``HOST``
or ``M`` filled in), and is run end to end, with those options, by the test ``END_TO_END`` names."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import shlex
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
PROGRAMS = re.compile(r"^(python recipes/\w+\.py|rein \w+|ray job submit)\b")

# The README command (continuation lines joined, trailing comment dropped) → the test that runs it end to end
# with the options shown (placeholders made local: a fake SGLang server for GPU:30000, the tiny model for M …).
END_TO_END = {
    "python recipes/swe_grpo.py --reward judge --judge-url http://HOST:30000/v1 --rubric rubric.md": (
        "tests/recipes/test_judge_recipe.py::test_swe_recipe_trains_on_judge_rewards"
    ),
    "python recipes/swe_grpo.py --tasks swebench:swegym.parquet --images images": (
        "tests/components/tasks/test_swebench_recipe.py::test_swe_grpo_one_step_on_image_tasks"
    ),
    "python recipes/swe_grpo.py --tasks swebench:.swebench/instances.parquet --images IMAGES --snapshots "
    ".swebench/snapshots": "tests/components/tasks/test_swebench_recipe.py::test_swe_grpo_one_step_on_image_tasks",
    # --help is its whole run: printed here, in process (``test_help_lists_every_flag``)
    "python recipes/swe_grpo.py --help": "tests/test_readme_commands.py::test_help_lists_every_flag",
    # the default options (the default model's 2 steps take ~4 min on CPU: `make run`; here the tiny model, 1 step)
    "python recipes/swe_grpo.py": "tests/recipes/test_ray_job.py::test_ray_job_submit_runs_one_swe_step",
    "python recipes/swe_grpo.py --model tiny --num-steps 1": (
        "tests/recipes/test_ray_job.py::test_ray_job_submit_runs_one_swe_step"
    ),
    "python recipes/swe_grpo.py --harness swe_agent,mini_swe_agent": (
        "tests/recipes/test_recipes.py::test_mixed_harness_recipe_one_step"
    ),
    "python recipes/swe_grpo.py --harness mini_swe_agent": (
        "tests/recipes/test_ray_job.py::test_ray_job_submit_runs_one_swe_step"
    ),
    "python recipes/swe_grpo.py --algorithm dr_grpo": (
        "tests/recipes/test_judge_recipe.py::test_swe_recipe_trains_on_judge_rewards"
    ),
    "python recipes/temporal_clue_grpo.py --model tiny --distillation-teachers M --distillation-kl-weight 0.5": (
        "tests/recipes/test_algorithm_options.py::test_distillation_dynamic_sampling_overlong_and_icepop_in_one_run"
    ),
    "python recipes/temporal_clue_grpo.py --model tiny --distillation-teachers M,M2 "
    "--distillation-teacher-rules 'temporal-clue-*[13579]=1'": (
        "tests/recipes/test_algorithm_options.py::test_distillation_dynamic_sampling_overlong_and_icepop_in_one_run"
    ),
    "python recipes/temporal_clue_grpo.py --model tiny --distillation-teachers vllm:http://HOST:8000": (
        "tests/recipes/test_algorithm_options.py::test_a_vllm_server_teaches_a_recipe_step"
    ),
    "python recipes/swe_grpo.py --harness swe_agent,mini_swe_agent --swe-agent-tool-call-reward 0.2 "
    "--trainer-turn-credit-enabled true --trainer-turn-credit-discount 0.9": (
        "tests/recipes/test_recipes.py::test_mixed_harness_recipe_one_step"
    ),
    "python recipes/temporal_clue_grpo.py --model tiny --algorithm-loss-importance-sampling icepop "
    "--rollout-dynamic-sampling-enabled true --trainer-overlong-mode penalty": (
        "tests/recipes/test_algorithm_options.py::test_distillation_dynamic_sampling_overlong_and_icepop_in_one_run"
    ),
    "python recipes/tictactoe_grpo.py --model tiny --trainer-turn-credit-enabled true "
    "--trainer-turn-credit-discount 0.9": (
        "tests/recipes/test_algorithm_options.py::test_turn_credit_trains_tictactoe_on_per_turn_rewards"
    ),
    "python recipes/tictactoe_grpo.py --model tiny --rollout-mode async --max-staleness 2": (
        "tests/recipes/test_async_loop.py::test_async_run_trains_every_committed_group_exactly_once"
    ),
    # in process: the recipe's own train() with the config those flags make (rollout.mode, rollout.max_staleness)
    "python recipes/tictactoe_grpo.py --model tiny --rollout-mode partial --max-staleness 2": (
        "tests/recipes/test_async_loop.py::test_partial_run_continues_rollouts_across_weight_pushes"
    ),
    "ray job submit --address http://HEAD:8265 --working-dir . --runtime-env-json "
    '\'{"excludes": [".venv", ".models", ".agents", "runs"], "env_vars": {"REIN_MODELS_DIR": "/abs/path/.models"}}\' '
    "-- python recipes/swe_grpo.py --run-dir /shared/runs/x": (
        "tests/recipes/test_ray_job.py::test_ray_job_submit_runs_one_swe_step"
    ),
    "python recipes/swe_grpo.py --model M --run-dir RUN_DIR --engine vllm --vllm-url http://GPU:8000 "
    "--num-steps 1 --num-tasks 1 --group-size 2 --max-turns 2": (
        "tests/recipes/test_ray_job.py::test_ray_job_submit_runs_one_swe_step_on_vllm"
    ),
    "python recipes/swe_grpo.py --model M --run-dir RUN_DIR --engine vllm --vllm-url "
    "http://GPU1:8000,http://GPU2:8000 --rollout-mode async --num-steps 1 --num-tasks 1 --group-size 2 "
    "--max-turns 2": "tests/recipes/test_swe_grpo_vllm.py::test_swe_grpo_async_step_on_several_vllm_servers",
    "ray job submit --address http://HEAD:8265 --working-dir . -- python recipes/swe_grpo.py --model M --engine "
    "vllm --vllm-url http://GPU:8000 --num-steps 1 --num-tasks 1 --group-size 2 --max-turns 2": (
        "tests/recipes/test_ray_job.py::test_ray_job_submit_runs_one_swe_step_on_vllm"
    ),
    "rein proxy --engine vllm --vllm-url http://GPU:8000 --model M --port 0 --run-dir RUN_DIR": (
        "tests/components/proxy/test_proxy_vllm.py::test_rein_proxy_engine_vllm_serves_an_agent_request"
    ),
    "python recipes/swe_grpo.py --model M --run-dir RUN_DIR --engine sglang --sglang-url http://GPU:30000 "
    "--sglang-api-key KEY --sglang-admin-api-key ADMIN_KEY --num-steps 2 --num-tasks 1 --group-size 2 "
    "--max-turns 2": "tests/recipes/test_swe_grpo_sglang.py::test_swe_grpo_on_sglang_behind_the_default_serve_proxy",
    "rein proxy --engine sglang --sglang-url http://GPU:30000 --sglang-api-key KEY --sglang-admin-api-key "
    "ADMIN_KEY --model M --port 0 --run-dir RUN_DIR": (
        "tests/components/engine/test_sglang_operations.py::test_rein_proxy_engine_sglang_serves_an_agent_request"
    ),
    "rein proxy --model M --port 0 --admin-key-file KEY_FILE": (
        "tests/components/proxy/test_proxy_cli_admin.py::"
        "test_rein_proxy_without_a_key_is_closed_and_hands_the_key_to_the_host_only"
    ),
    "rein proxy --model M --port 0 --run-dir RUN_DIR --temperature 0.6 --top-p 0.9 --top-k 20 "
    "--record-routed-experts": (
        "tests/components/proxy/test_proxy_cli_sampling.py::"
        "test_rein_proxy_samples_with_the_run_distribution_and_records_routes"
    ),
}
# Commands no test can run here, why, and the test that covers the part that can run.
NOT_RUN_HERE = {
    "python recipes/swe_grpo.py --sandbox-backend e2b": (
        "E2B is a cloud service (E2B_API_KEY); the flag's brick is built and its provider tested on a fake SDK",
        "tests/components/test_bricks.py::test_config_names_pick_the_bricks",
    ),
}


def canonical(command: str) -> str:
    """One spelling of a shell command: comment dropped, continuation lines joined, tokens re-quoted."""
    return shlex.join(shlex.split(command, comments=True))


def readme_commands() -> list[str]:
    """The README's commands of the recipes, ``rein`` and ``ray job submit``, one line each (``canonical``)."""
    commands, in_block, pending = [], False, ""
    for line in README.read_text().splitlines():
        if line.strip().startswith("```"):
            in_block, pending = not in_block, ""
            continue
        if not in_block:
            continue
        text = f"{pending} {line.strip()}".strip()
        if text.endswith("\\"):
            pending = text[:-1].strip()
            continue
        pending = ""
        if PROGRAMS.match(text):
            commands.append(canonical(text))
    return commands


@pytest.fixture(scope="module")
def placeholders(tmp_path_factory, tiny_model_dir) -> dict[str, str]:
    """README placeholders → values the parsers accept (a rubric file that exists, a real HF folder …)."""
    folder = tmp_path_factory.mktemp("readme")
    (folder / "rubric.md").write_text("A good run fixes the bug.\n")
    return {"M": str(tiny_model_dir), "rubric.md": str(folder / "rubric.md"), "RUN_DIR": str(folder / "run")}


def parse(command: str, placeholders: dict[str, str]) -> tuple[object, set[str], list[str]]:
    """The command's arguments parsed by the program's own parser (``SystemExit`` on a bad flag or value), the
    flags that parser knows, and the arguments it parsed."""
    argv = [placeholders.get(token, token) for token in shlex.split(command)]
    if argv[:3] == ["ray", "job", "submit"]:
        from ray.dashboard.modules.job.cli import submit

        params = submit.make_context("submit", argv[3:]).params
        json.loads(params["runtime_env_json"] or "{}")  # what the job server reads
        assert params["working_dir"] == "." and params["entrypoint"], params
        return parse(shlex.join(params["entrypoint"]), placeholders)
    if argv[0] == "rein":
        from components.cli import SUBCOMMANDS

        assert argv[1] in SUBCOMMANDS, f"rein has no subcommand {argv[1]!r}"
        assert argv[1] == "proxy", f"add how to parse `rein {argv[1]}` here"
        from components.proxy.cli import StandaloneProxyConfig, parse_proxy_config
        from components.recipe_config import command_line_flags

        flags = command_line_flags(StandaloneProxyConfig, argv[2:])
        return parse_proxy_config(argv[2:]), flags, argv[2:]
    from components.recipe_config import command_line_flags, parse_config

    assert argv[0] == "python", argv
    config_class = _recipe_config(Path(argv[1]).stem)
    flags = command_line_flags(config_class, argv[2:])
    return parse_config(config_class, argv[2:]), flags, argv[2:]


def test_the_table_lists_exactly_the_readme_commands():
    commands = readme_commands()
    assert len(commands) >= 15, commands  # the extraction found the README's commands
    table = {canonical(command) for command in (*END_TO_END, *NOT_RUN_HERE)}
    missing = [command for command in commands if command not in table]
    assert not missing, f"README commands with no end-to-end test named in END_TO_END: {missing}"
    stale = sorted(table - set(commands))
    assert not stale, f"END_TO_END / NOT_RUN_HERE name commands the README no longer shows: {stale}"


@pytest.mark.parametrize("command", [c for c in readme_commands() if not c.endswith("--help")])
def test_readme_command_parses_with_its_programs_parser(command, placeholders):
    _, known_flags, argv = parse(command, placeholders)
    shown = {token for token in argv if token.startswith("--")}
    assert shown <= known_flags, (
        f"not a flag of its own (argparse would take an abbreviation): {shown - known_flags}"
    )


def _recipe_config(recipe: str) -> type:
    """The config class ``recipes/<recipe>.py`` defines (its command line)."""
    from components.run.config import RunConfig

    module = importlib.import_module(f"recipes.{recipe}")
    [config_class] = [
        value
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, RunConfig) and value.__module__ == module.__name__
    ]
    return config_class


def _recipe_fields(recipe: str) -> dict[str, str]:
    """A recipe's flags → the name of the config field each sets (``--rollout-mode`` → ``mode``)."""
    from components.recipe_config import config_flags

    return {flag: field.rsplit(".", 1)[-1] for field, flag in config_flags(_recipe_config(recipe)).items()}


def _test_function(node_id: str):
    path, name = node_id.split("::")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    function = getattr(module, name, None)
    assert callable(function), f"{node_id} does not exist"
    return module, function


@pytest.mark.parametrize("command", sorted(END_TO_END))
def test_the_named_test_exists_and_passes_the_commands_options(command):
    node_id = END_TO_END[command]
    module, function = _test_function(node_id)
    if function is test_help_lists_every_flag:
        return
    # The program, flags and plain values the README shows appear in the test's module (its code or helpers):
    # a flag as written, or (a recipe run in process) its config field as a keyword argument.
    source = inspect.getsource(module)
    tree = ast.parse(source)
    strings = {str(node.value) for node in ast.walk(tree) if isinstance(node, ast.Constant)}
    keywords = {node.arg for node in ast.walk(tree) if isinstance(node, ast.keyword)}
    tokens = shlex.split(command)
    entrypoint = tokens[tokens.index("--") + 1 :] if "--" in tokens else tokens
    program = Path(entrypoint[1]).stem if entrypoint[0] == "python" else entrypoint[1]
    assert program in source, f"{node_id} never runs {program}"
    fields = _recipe_fields(program) if entrypoint[0] == "python" else {}
    for index, token in enumerate(tokens):
        if not token.startswith("--") or token == "--":
            continue
        assert token in strings or fields.get(token) in keywords, f"{node_id} never passes {token}"
        value = tokens[index + 1] if index + 1 < len(tokens) else ""
        # A placeholder (HOST, M, RUN_DIR), a path or URL, or the tiny model (passed as its folder) is made
        # local by the test; a plain value (dr_grpo, mini_swe_agent, async, 2) must be passed as shown.
        plain = not value.startswith("-") and not re.search(r"[A-Z/:.]", value) and token != "--model"
        if value and plain:
            assert value in strings, f"{node_id} never passes {token} {value}"


@pytest.mark.parametrize("command", sorted(NOT_RUN_HERE))
def test_commands_not_run_here_say_why_and_their_covering_test_exists(command):
    reason, node_id = NOT_RUN_HERE[command]
    assert reason
    _test_function(node_id)


def test_help_lists_every_flag(capsys):
    from components.recipe_config import config_flags
    from recipes.swe_grpo import SweGrpoConfig

    [command] = [c for c in readme_commands() if c.endswith("--help")]
    with pytest.raises(SystemExit) as exit_info:
        parse(command, {})
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in config_flags(SweGrpoConfig).values():
        assert f"{flag} " in text, flag
    assert "(default: swe_agent)" in " ".join(text.split()) and "engine brick" in text
