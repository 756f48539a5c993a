"""Make SWE-style tasks by injecting bugs into ``minilib`` (SWE-smith style), and check task files.

    python -m components.tasks.generate --out tasks.jsonl [--max-tasks 40 --seed 0]   # AST mutations
    python -m components.tasks.generate --curated [--out components/tasks/builtin/tasks.jsonl]
    python -m components.tasks.generate --check components/tasks/builtin/tasks.jsonl

Mutation mode applies rules to every function of the pristine library (comparison flipped, ``+``/``-``
swapped, integer constant off by one, boolean default flipped, ``and``/``or`` swapped, an ``if`` block
dropped, two call arguments swapped), runs the hidden tests on each mutant in a bubblewrap sandbox, and keeps
mutants that make at least one and at most ``--max-failing-fraction`` of the hidden tests fail: those tests
become FAIL_TO_PASS, the rest PASS_TO_PASS. Curated mode does the same for the hand-written bugs of
``builtin/catalog.py`` (with human problem statements). ``--check`` verifies, through the real grader, that
each task's reference fix passes every FAIL_TO_PASS and PASS_TO_PASS test and the buggy snapshot fails every
FAIL_TO_PASS test. All test runs happen in sandboxes; nothing runs the library on the host.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import difflib
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from components.tasks.builtin import BUILTIN_DIR, BUILTIN_TASKS_FILE, HIDDEN_TESTS_DIR, MINILIB_DIR
from components.tasks.builtin.catalog import CURATED_BUGS, InjectedBug
from components.tasks.grading import SandboxFactory, SweGrader, SweGraderConfig, compute_reward
from components.tasks.swe import SweTask, load_tasks

# ----------------------------------------------------------------------------------------------------------
# Patches
# ----------------------------------------------------------------------------------------------------------


def make_patch(path: str, before: str, after: str) -> str:
    """A git-style unified diff turning ``before`` into ``after`` for the file at ``path``."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}", n=3
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


@dataclass(frozen=True, kw_only=True)
class Mutant:
    """One candidate bug: ``path``'s pristine text becomes ``mutated_text``."""

    task_id: str
    path: str
    mutated_text: str
    kind: str
    function: str
    description: str
    problem_statement: str = ""


def curated_mutant(bug: InjectedBug, repo_dir: Path = MINILIB_DIR) -> Mutant:
    """The mutant of a hand-written bug; ValueError unless its snippet occurs exactly once."""
    text = (repo_dir / bug.path).read_text(encoding="utf-8")
    count = text.count(bug.original)
    if count != 1:
        raise ValueError(
            f"{bug.task_id}: 'original' occurs {count} times in {bug.path}, expected exactly once"
        )
    return Mutant(
        task_id=bug.task_id,
        path=bug.path,
        mutated_text=text.replace(bug.original, bug.mutated),
        kind=bug.kind,
        function="",
        description=bug.kind,
        problem_statement=bug.problem_statement,
    )


# ----------------------------------------------------------------------------------------------------------
# Mutation rules (AST level, applied as minimal text edits so the diff stays a few lines)
# ----------------------------------------------------------------------------------------------------------

_COMPARE_SWAPS = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
}
_BINOP_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.FloorDiv: ast.Div, ast.Mult: ast.Add}


def _replace_node_text(source: str, node: ast.AST, new_text: str) -> str:
    lines = source.splitlines(keepends=True)
    start = sum(len(line) for line in lines[: node.lineno - 1]) + _char_offset(
        lines[node.lineno - 1], node.col_offset
    )
    end = sum(len(line) for line in lines[: node.end_lineno - 1]) + _char_offset(
        lines[node.end_lineno - 1], node.end_col_offset
    )
    return source[:start] + new_text + source[end:]


def _char_offset(line: str, byte_offset: int) -> int:
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8"))


def _without_statement(source: str, node: ast.stmt, *, alone: bool) -> str:
    """Remove a whole statement (its lines); a statement alone in its block becomes ``pass``."""
    lines = source.splitlines(keepends=True)
    indent = lines[node.lineno - 1][: node.col_offset]
    replacement = f"{indent}pass\n" if alone else ""
    return "".join(lines[: node.lineno - 1]) + replacement + "".join(lines[node.end_lineno :])


def _block_sizes(function: ast.AST) -> dict[int, int]:
    """For every statement under ``function``: the number of statements in its block (keyed by id)."""
    sizes: dict[int, int] = {}
    for node in ast.walk(function):
        for field_name in ("body", "orelse", "finalbody"):
            block = getattr(node, field_name, None)
            if isinstance(block, list):
                for statement in block:
                    sizes[id(statement)] = len(block)
    return sizes


def mutants_of_file(path: str, source: str) -> Iterator[tuple[str, str, str, str]]:
    """Every rule applied once to every matching node: (function, kind, description, mutated source)."""
    tree = ast.parse(source)
    for function in [
        node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]:
        name = function.name
        block_sizes = _block_sizes(function)
        defaults = function.args.defaults + [d for d in function.args.kw_defaults if d is not None]
        for default in defaults:
            if isinstance(default, ast.Constant) and isinstance(default.value, bool):
                yield (
                    name,
                    "wrong-default",
                    f"default {default.value} -> {not default.value}",
                    _replace_node_text(source, default, repr(not default.value)),
                )
        for node in ast.walk(function):
            if node is function:
                continue
            if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE_SWAPS:
                mutated = ast.Compare(
                    left=node.left, ops=[_COMPARE_SWAPS[type(node.ops[0])]()], comparators=node.comparators
                )
                yield (
                    name,
                    "wrong-comparison",
                    f"{ast.unparse(node)} -> {ast.unparse(mutated)}",
                    _replace_node_text(source, node, ast.unparse(mutated)),
                )
            elif isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAPS:
                mutated = ast.BinOp(left=node.left, op=_BINOP_SWAPS[type(node.op)](), right=node.right)
                yield (
                    name,
                    "wrong-operator",
                    f"{ast.unparse(node)} -> {ast.unparse(mutated)}",
                    _replace_node_text(source, node, f"({ast.unparse(mutated)})"),
                )
            elif isinstance(node, ast.BoolOp):
                mutated = ast.BoolOp(
                    op=ast.Or() if isinstance(node.op, ast.And) else ast.And(), values=node.values
                )
                yield (
                    name,
                    "wrong-operator",
                    f"{ast.unparse(node)} -> {ast.unparse(mutated)}",
                    _replace_node_text(source, node, f"({ast.unparse(mutated)})"),
                )
            elif isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 100:
                for delta in (1, -1):
                    if node.value + delta >= 0:
                        yield (
                            name,
                            "off-by-one",
                            f"{node.value} -> {node.value + delta}",
                            _replace_node_text(source, node, str(node.value + delta)),
                        )
            elif isinstance(node, ast.If) and not node.orelse and node is not function.body[0]:
                yield (
                    name,
                    "missing-edge-case",
                    f"dropped `if {ast.unparse(node.test)}:` block",
                    _without_statement(source, node, alone=block_sizes.get(id(node), 1) == 1),
                )
            elif (
                isinstance(node, ast.Call)
                and len(node.args) == 2
                and not node.keywords
                and not any(isinstance(arg, ast.Starred) for arg in node.args)
                and ast.unparse(node.args[0]) != ast.unparse(node.args[1])
            ):
                swapped = ast.Call(func=node.func, args=[node.args[1], node.args[0]], keywords=[])
                yield (
                    name,
                    "swapped-arguments",
                    f"{ast.unparse(node)} -> {ast.unparse(swapped)}",
                    _replace_node_text(source, node, ast.unparse(swapped)),
                )


def all_mutants(repo_dir: Path = MINILIB_DIR) -> list[Mutant]:
    """Every rule-generated mutant of the library's modules (not its tests)."""
    mutants: list[Mutant] = []
    for file in sorted((repo_dir / "minilib").glob("*.py")):
        relative = file.relative_to(repo_dir).as_posix()
        source = file.read_text(encoding="utf-8")
        for index, (function, kind, description, mutated) in enumerate(mutants_of_file(relative, source)):
            try:
                ast.parse(mutated)
            except SyntaxError:
                continue
            if mutated == source:
                continue
            mutants.append(
                Mutant(
                    task_id=f"minilib-{file.stem}-{function.strip('_')}-{kind}-{index}",
                    path=relative,
                    mutated_text=mutated,
                    kind=kind,
                    function=function,
                    description=description,
                )
            )
    return mutants


# ----------------------------------------------------------------------------------------------------------
# Turning mutants into tasks
# ----------------------------------------------------------------------------------------------------------


def _relative(path: Path, start: Path) -> str:
    return os.path.relpath(path.resolve(), start.resolve())


def hidden_tests_dir_for(path: str, hidden_dir: Path = HIDDEN_TESTS_DIR) -> Path:
    """The hidden tests of the module at ``path``: ``hidden_dir/<module>`` when it exists, else all of them."""
    module_dir = hidden_dir / Path(path).stem
    return module_dir if module_dir.is_dir() else hidden_dir


def provisional_task(mutant: Mutant, *, repo_dir: Path, hidden_dir: Path, cache_dir: Path | None) -> SweTask:
    """A task for ``mutant`` whose FAIL_TO_PASS / PASS_TO_PASS are not known yet."""
    pristine = (repo_dir / mutant.path).read_text(encoding="utf-8")
    hidden_dir = hidden_tests_dir_for(mutant.path, hidden_dir)
    hidden = {
        file.relative_to(hidden_dir).as_posix(): file.read_text(encoding="utf-8")
        for file in sorted(hidden_dir.rglob("*.py"))
        if "__pycache__" not in file.parts
    }
    extra = {"cache_dir": cache_dir} if cache_dir is not None else {}
    return SweTask(
        task_id=mutant.task_id,
        problem_statement=mutant.problem_statement or "(to be written)",
        repo=repo_dir.resolve(),
        hidden_tests=hidden,
        fail_to_pass=(),
        pass_to_pass=(),
        reference_patch=make_patch(mutant.path, mutant.mutated_text, pristine),
        bug_patch=make_patch(mutant.path, pristine, mutant.mutated_text),
        **extra,
    )


def auto_problem_statement(mutant: Mutant, failing: Sequence[str]) -> str:
    """A symptom-level report for a rule-generated bug (names the function and the failing checks)."""
    module = mutant.path.removesuffix(".py").replace("/", ".")
    checks = ", ".join(node_id.split("::", 1)[1] for node_id in failing[:4])
    return (
        f"Something is off in `{mutant.function}` ({module}): since the last change it gives wrong results "
        f"or errors for some inputs. These checks from our test suite fail now: {checks}. "
        "Please find and fix the bug."
    )


async def classify(
    task: SweTask, grader: SweGrader
) -> tuple[dict[str, str] | None, dict[str, str] | None, str]:
    """Hidden-test outcomes on the buggy snapshot and with the reference fix (None when a run failed)."""
    buggy = await grader.run_hidden_tests(task, "")
    fixed = await grader.run_hidden_tests(task, task.reference_patch)
    note = ""
    if buggy.outcomes is None or fixed.outcomes is None:
        note = (buggy if buggy.outcomes is None else fixed).output_tail[-800:]
    return buggy.outcomes, fixed.outcomes, note


async def build_tasks(
    mutants: Sequence[Mutant],
    *,
    sandbox_factory: SandboxFactory,
    repo_dir: Path = MINILIB_DIR,
    hidden_dir: Path = HIDDEN_TESTS_DIR,
    max_failing_fraction: float = 1.0,
    max_tasks: int | None = None,
    concurrency: int = 2,
    cache_dir: Path | None = None,
) -> list[SweTask]:
    """Run each mutant's hidden tests in sandboxes; keep those that break some tests (in input order)."""
    grader = SweGrader(sandbox_factory, SweGraderConfig())
    semaphore = asyncio.Semaphore(concurrency)
    kept: dict[int, SweTask] = {}

    async def evaluate(index: int, mutant: Mutant) -> None:
        if max_tasks is not None and len(kept) >= max_tasks:
            return
        async with semaphore:
            if max_tasks is not None and len(kept) >= max_tasks:
                return
            task = provisional_task(mutant, repo_dir=repo_dir, hidden_dir=hidden_dir, cache_dir=cache_dir)
            buggy, fixed, note = await classify(task, grader)
        if buggy is None or fixed is None:
            print(f"skip {mutant.task_id}: a test run produced no report\n{note}", file=sys.stderr)
            return
        not_fixed = sorted(node for node, outcome in fixed.items() if outcome != "passed")
        if not_fixed:
            raise ValueError(f"{mutant.task_id}: the pristine library fails hidden tests {not_fixed}")
        fail_to_pass = sorted(node for node, outcome in buggy.items() if outcome != "passed")
        pass_to_pass = sorted(node for node in fixed if node not in fail_to_pass)
        if not fail_to_pass or len(fail_to_pass) > max_failing_fraction * len(fixed):
            return
        statement = mutant.problem_statement or auto_problem_statement(mutant, fail_to_pass)
        kept[index] = replace(
            task,
            fail_to_pass=tuple(fail_to_pass),
            pass_to_pass=tuple(pass_to_pass),
            problem_statement=statement,
        )

    await asyncio.gather(*(evaluate(index, mutant) for index, mutant in enumerate(mutants)))
    tasks = [kept[index] for index in sorted(kept)]
    return tasks[:max_tasks] if max_tasks is not None else tasks


def write_tasks(tasks: Sequence[SweTask], out: Path, *, hidden_dirs: dict[str, Path]) -> None:
    """Write tasks as JSONL; ``repo`` and ``hidden_tests`` (the directory per task id) become relative paths."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for task in tasks:
        record = {
            "task_id": task.task_id,
            "repo": _relative(task.repo, out.parent),
            "bug_patch": task.bug_patch,
            "problem_statement": task.problem_statement,
            "setup_commands": list(task.setup_commands),
            "hidden_tests": _relative(hidden_dirs[task.task_id], out.parent),
            "FAIL_TO_PASS": list(task.fail_to_pass),
            "PASS_TO_PASS": list(task.pass_to_pass),
            "reference_patch": task.reference_patch,
        }
        lines.append(json.dumps(record, ensure_ascii=False))
    with tempfile.NamedTemporaryFile(
        "w", dir=out.parent, delete=False, suffix=".tmp", encoding="utf-8"
    ) as handle:
        handle.write("\n".join(lines) + "\n")
    os.chmod(handle.name, 0o644)
    os.replace(handle.name, out)


# ----------------------------------------------------------------------------------------------------------
# Checking
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TaskCheck:
    """The verdict of ``--check`` for one task."""

    task_id: str
    ok: bool
    reference_reward: float | None
    buggy_reward: float | None
    problems: tuple[str, ...] = ()


async def check_task(task: SweTask, grader: SweGrader) -> TaskCheck:
    """Reference fix → reward 1 (all FAIL_TO_PASS + PASS_TO_PASS pass); buggy → every FAIL_TO_PASS fails."""
    problems: list[str] = []
    fixed = await grader.grade_patch(task, task.reference_patch)
    if fixed.reward != 1.0:
        problems.append(f"reference fix earned {fixed.reward} ({fixed.error or fixed.log.splitlines()[-1]})")
    buggy_run = await grader.run_hidden_tests(task, "")
    buggy_reward: float | None = None
    if buggy_run.outcomes is None:
        problems.append(f"buggy snapshot produced no test report: {buggy_run.output_tail[-500:]}")
    else:
        buggy_reward, _ = compute_reward(task, buggy_run.outcomes, partial_credit=False)
        still_passing = [node for node in task.fail_to_pass if buggy_run.outcomes.get(node) == "passed"]
        if still_passing:
            problems.append(f"FAIL_TO_PASS tests pass on the buggy snapshot: {still_passing}")
    return TaskCheck(
        task_id=task.task_id,
        ok=not problems,
        reference_reward=fixed.reward,
        buggy_reward=buggy_reward,
        problems=tuple(problems),
    )


async def check_tasks(
    tasks: Sequence[SweTask], sandbox_factory: SandboxFactory, *, concurrency: int = 2
) -> list[TaskCheck]:
    """``check_task`` for every task, ``concurrency`` at a time, in input order."""
    grader = SweGrader(sandbox_factory, SweGraderConfig())
    semaphore = asyncio.Semaphore(concurrency)

    async def one(task: SweTask) -> TaskCheck:
        async with semaphore:
            return await check_task(task, grader)

    return list(await asyncio.gather(*(one(task) for task in tasks)))


# ----------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------


def default_sandbox_factory() -> SandboxFactory:
    """Local bubblewrap sandboxes (imported lazily: generating the task list needs none)."""
    from sandboxes.bwrap import BwrapSandbox

    return BwrapSandbox.create


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m components.tasks.generate", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--out", type=Path, help="JSONL file to write (default with --curated: the built-in set)"
    )
    parser.add_argument(
        "--curated", action="store_true", help="build the hand-written bugs of builtin/catalog.py"
    )
    parser.add_argument("--check", type=Path, nargs="?", const=None, default=False, help="check a task file")
    parser.add_argument("--max-tasks", type=int, default=None, help="stop after this many kept mutants")
    parser.add_argument(
        "--max-failing-fraction", type=float, default=0.25, help="drop mutants breaking more tests"
    )
    parser.add_argument("--seed", type=int, default=0, help="shuffles mutation candidates")
    parser.add_argument("--concurrency", type=int, default=2, help="sandboxes running at once")
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="snapshot cache (default ~/.cache/rein/tasks)"
    )
    args = parser.parse_args(argv)
    if args.concurrency < 1:
        parser.error("--concurrency must be >= 1")
    factory = default_sandbox_factory()
    started = time.monotonic()
    out: Path | None = args.out
    if args.curated or out is not None:
        if args.curated:
            mutants = [curated_mutant(bug) for bug in CURATED_BUGS]
            out = out or BUILTIN_TASKS_FILE
            fraction = 1.0
        else:
            mutants = all_mutants()
            random.Random(args.seed).shuffle(mutants)
            fraction = args.max_failing_fraction
        print(f"evaluating {len(mutants)} candidate bugs ...", file=sys.stderr)
        tasks = asyncio.run(
            build_tasks(
                mutants,
                sandbox_factory=factory,
                max_failing_fraction=fraction,
                max_tasks=args.max_tasks,
                concurrency=args.concurrency,
                cache_dir=args.cache_dir,
            )
        )
        hidden_dirs = {mutant.task_id: hidden_tests_dir_for(mutant.path) for mutant in mutants}
        write_tasks(tasks, out, hidden_dirs=hidden_dirs)
        print(f"wrote {len(tasks)} tasks to {out} in {time.monotonic() - started:.0f}s", file=sys.stderr)
    if args.check is not False:
        path = args.check or out
        if path is None:
            parser.error("--check needs a task file (or --out/--curated to check what was written)")
        tasks = load_tasks(path, cache_dir=args.cache_dir)
        checks = asyncio.run(check_tasks(tasks, factory, concurrency=args.concurrency))
        for check in checks:
            status = "ok  " if check.ok else "FAIL"
            print(f"{status} {check.task_id}: reference {check.reference_reward}, buggy {check.buggy_reward}")
            for problem in check.problems:
                print(f"     {problem}")
        num_ok = sum(check.ok for check in checks)
        print(f"check: {num_ok}/{len(checks)} tasks ok in {time.monotonic() - started:.0f}s")
        return 0 if num_ok == len(checks) else 1
    if not (args.curated or out is not None):
        parser.error("nothing to do: give --out, --curated or --check")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "BUILTIN_DIR",
    "Mutant",
    "TaskCheck",
    "all_mutants",
    "build_tasks",
    "check_tasks",
    "curated_mutant",
    "make_patch",
    "write_tasks",
]
