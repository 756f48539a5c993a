"""SWE-bench-format instances from real upstream bug fixes: consecutive PyPI releases of small libraries.

A manifest (JSON list) names, per instance, a package and two consecutive releases whose source
distributions ship their tests, the test command, the FAIL_TO_PASS / PASS_TO_PASS test ids and a problem
statement. Nothing third-party is stored in this repository: at set-up the sdists are downloaded from PyPI
(``pip download --no-binary :all: --no-deps``), the older release becomes the repository snapshot (the
instance's ``base_commit`` is its flattened git commit), and the release diff is split into ``patch``
(everything but tests) and ``test_patch`` (test files). The result is a Parquet file in the data sets' own
column layout plus one snapshot directory per instance — read back by ``components.tasks.swebench``.

    python -m components.tasks.swebench_pypi build --manifest M.json --out DIR [--image oci:DIR:TAG]
    python -m components.tasks.swebench_pypi discover --package P --old A --new B --image oci:DIR:TAG

``discover`` runs the new release's tests on both releases in the image and prints the candidate test ids
(what a manifest entry records). ``build`` is offline after the downloads (kept in ``DIR/sdists``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from components.tasks.swe import _git_env

# What an sdist ships that is no release's source; a ``.git`` directory would hand its hooks and config to the
# host's git (``release_diff`` commits in the extracted tree).
_NOISE = re.compile(r"(^|/)(PKG-INFO|[^/]+\.egg-info(/.*)?|\.git(/.*)?|\.gitignore|setup\.cfg|MANIFEST\.in)$")
_TEST_PATH = re.compile(r"(^|/)(tests?|testing)(/|$)|(^|/)test_[^/]*\.py$|_test\.py$|(^|/)conftest\.py$")


@dataclass(frozen=True, kw_only=True)
class ReleasePair:
    """One manifest entry: a bug fix between two consecutive releases."""

    instance_id: str
    package: str
    old: str
    new: str
    test_cmd: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    problem_statement: str
    created_at: str = ""

    @classmethod
    def from_json(cls, entry: dict) -> ReleasePair:
        return cls(
            instance_id=entry["instance_id"],
            package=entry["package"],
            old=entry["old"],
            new=entry["new"],
            test_cmd=entry["test_cmd"],
            fail_to_pass=tuple(entry["FAIL_TO_PASS"]),
            pass_to_pass=tuple(entry.get("PASS_TO_PASS", ())),
            problem_statement=entry["problem_statement"],
            created_at=entry.get("created_at", ""),
        )


def download_sdist(package: str, version: str, into: Path) -> Path:
    """The release's sdist from the package index (cached in ``into``)."""
    into.mkdir(parents=True, exist_ok=True)
    normalized = re.sub(r"[-_.]+", "[-_.]", re.escape(package).replace("\\-", "-"))
    pattern = re.compile(rf"^{normalized}-{re.escape(version)}\.(tar\.gz|zip)$", re.IGNORECASE)
    for existing in into.iterdir():
        if pattern.match(existing.name):
            return existing
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
         "-d", str(into), f"{package}=={version}"],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    for existing in into.iterdir():
        if pattern.match(existing.name):
            return existing
    raise FileNotFoundError(f"pip downloaded no sdist for {package}=={version} into {into}")


def extract_sdist(archive: Path, destination: Path) -> Path:
    """Unpack an sdist into ``destination`` (its single top-level folder unwrapped)."""
    destination.mkdir(parents=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as handle:
            handle.extractall(destination)
    else:
        with tarfile.open(archive) as handle:
            handle.extractall(destination, filter="data")
    entries = list(destination.iterdir())
    if len(entries) == 1 and entries[0].is_dir():
        inner = entries[0]
        for child in inner.iterdir():
            child.rename(destination / child.name)
        inner.rmdir()
    for path in sorted(destination.rglob("*"), reverse=True):
        relative = path.relative_to(destination).as_posix()
        if _NOISE.search(relative) or "__pycache__" in relative.split("/"):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    return destination


def release_diff(old_tree: Path, new_tree: Path) -> tuple[str, str]:
    """``(patch, test_patch)``: the old -> new diff, split into non-test and test files."""
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "repo"
        shutil.copytree(old_tree, repo, symlinks=True)
        env = _git_env()

        def git(*args: str) -> str:
            return subprocess.run(
                ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True, timeout=120
            ).stdout

        git("init", "-q", "-b", "main")
        git("add", "-A")
        git("commit", "-q", "--no-gpg-sign", "-m", "old")
        for child in repo.iterdir():
            if child.name != ".git":
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        for child in new_tree.iterdir():
            target = repo / child.name
            shutil.copytree(child, target, symlinks=True) if child.is_dir() else shutil.copy2(child, target)
        # Staged from content, not stat data: a new file of the old one's size and (sdist) mtime, on a reused
        # inode, would look unchanged to the old index.
        (repo / ".git" / "index").unlink()
        git("add", "-A")
        changed = [
            line for line in git("diff", "--cached", "--name-only", "--no-renames").splitlines() if line
        ]
        tests = [path for path in changed if _TEST_PATH.search(path)]
        others = [path for path in changed if not _TEST_PATH.search(path)]
        diff_args = ("diff", "--cached", "--binary", "--no-renames", "--full-index", "--")
        patch = git(*diff_args, *others) if others else ""
        test_patch = git(*diff_args, *tests) if tests else ""
    return patch, test_patch


def build_instances(
    manifest: Path, out: Path, *, image: str | None = None, bake_into: Path | None = None
) -> Path:
    """Download, extract and diff every manifest entry; write ``out/instances.parquet`` and ``out/snapshots``.

    ``bake_into``: an OCI layout whose ``latest`` tag is the environment image; each instance then gets its own
    tag there (the instance id) with the old release as a git repository at ``/testbed``, as SWE-bench's
    instance images hold theirs, and its row names that image."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    entries = [ReleasePair.from_json(entry) for entry in json.loads(Path(manifest).read_text())]
    sdists = out / "sdists"
    snapshots = out / "snapshots"
    snapshots.mkdir(parents=True, exist_ok=True)
    rows = []
    for entry in entries:
        with tempfile.TemporaryDirectory() as scratch:
            old_tree = extract_sdist(download_sdist(entry.package, entry.old, sdists), Path(scratch) / "old")
            new_tree = extract_sdist(download_sdist(entry.package, entry.new, sdists), Path(scratch) / "new")
            patch, test_patch = release_diff(old_tree, new_tree)
            target = snapshots / entry.instance_id
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(old_tree, target, symlinks=True)
        row = {
            "instance_id": entry.instance_id,
            "repo": f"pypi/{entry.package}",
            "base_commit": f"{entry.package}-{entry.old}",
            "patch": patch,
            "test_patch": test_patch,
            "problem_statement": entry.problem_statement,
            "hints_text": "",
            "created_at": entry.created_at,
            "version": entry.old,
            "environment_setup_commit": "",
            "FAIL_TO_PASS": json.dumps(list(entry.fail_to_pass)),
            "PASS_TO_PASS": json.dumps(list(entry.pass_to_pass)),
            "test_cmd": entry.test_cmd,
            "image_name": image or "",
            "fixed_version": entry.new,
        }
        rows.append(row)
    if bake_into is not None:
        for row in rows:
            row["image_name"] = bake_instance_image(
                bake_into, snapshots / row["instance_id"], row["instance_id"]
            )
        # Re-baking leaves the previous instance layers unreferenced: drop them.
        subprocess.run(
            ["umoci", "gc", "--layout", str(bake_into)], check=True, capture_output=True, timeout=600
        )
    table = pa.Table.from_pylist(rows)
    path = out / "instances.parquet"
    pq.write_table(table, path)
    return path


def bake_instance_image(layout: Path, snapshot: Path, tag: str) -> str:
    """Tag ``layout:latest`` as ``layout:TAG`` plus one layer holding ``snapshot`` as a git repository at
    ``/testbed`` (``umoci insert``: the environment layers are shared). Returns the image name (``BASE:TAG``)."""
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "testbed"
        shutil.copytree(snapshot, repo, symlinks=True)
        env = _git_env()
        for command in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                        ["git", "commit", "-q", "--no-gpg-sign", "-m", f"base of {tag}"]):  # fmt: skip
            subprocess.run(command, cwd=repo, env=env, check=True, capture_output=True, timeout=120)
        subprocess.run(
            ["umoci", "tag", "--image", f"{layout}:latest", tag], check=True, capture_output=True, timeout=120
        )
        subprocess.run(["umoci", "insert", "--image", f"{layout}:{tag}", "--opaque", str(repo), "/testbed"],
                       check=True, capture_output=True, timeout=600)  # fmt: skip
    return f"{Path(layout).name}:{tag}"


async def discover(package: str, old: str, new: str, image: str, test_cmd: str, work: Path) -> dict:
    """Run the new release's tests on the old and the new release in ``image``; report F2P / P2P candidates."""
    from swebench.harness.log_parsers.python import parse_log_pytest

    from components.protocols import SandboxSpec
    from sandboxes.image import ImageSandboxConfig, create_image_sandbox

    sdists = work / "sdists"
    scratch = Path(tempfile.mkdtemp(dir=work))
    old_tree = extract_sdist(download_sdist(package, old, sdists), scratch / "old")
    new_tree = extract_sdist(download_sdist(package, new, sdists), scratch / "new")
    patch, test_patch = release_diff(old_tree, new_tree)
    results = {}
    for label, tree in (("old", old_tree), ("new", new_tree)):
        if label == "old":  # the new tests over the old code
            _apply(tree, test_patch)
        spec = SandboxSpec(workspace_source=tree, root_image=image)
        sandbox = await create_image_sandbox(spec, ImageSandboxConfig(cache_dir=work / "images"))
        try:
            result = await sandbox.exec(["bash", "-c", test_cmd], timeout_s=600)
        finally:
            await sandbox.close()
        results[label] = parse_log_pytest(result.stdout + result.stderr, None)
    passed = {name for name, status in results["new"].items() if status == "PASSED"}
    fail_to_pass = sorted(name for name in passed if results["old"].get(name) != "PASSED")
    pass_to_pass = sorted(name for name in passed if results["old"].get(name) == "PASSED")
    shutil.rmtree(scratch, ignore_errors=True)
    return {
        "package": package, "old": old, "new": new, "FAIL_TO_PASS": fail_to_pass,
        "PASS_TO_PASS": pass_to_pass, "patch_lines": len(patch.splitlines()),
        "test_patch_files": re.findall(r"^diff --git a/(\S+)", test_patch, re.M),
        "patch_files": re.findall(r"^diff --git a/(\S+)", patch, re.M),
    }  # fmt: skip


def _apply(tree: Path, diff: str) -> None:
    if not diff.strip():
        return
    with tempfile.NamedTemporaryFile("w", suffix=".diff", delete=False) as handle:
        handle.write(diff)
    try:
        subprocess.run(["git", "apply", "--whitespace=nowarn", handle.name], cwd=tree, check=True,
                       capture_output=True, timeout=60, env=_git_env())  # fmt: skip
    finally:
        os.unlink(handle.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m components.tasks.swebench_pypi", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build instances from a manifest")
    build.add_argument("--manifest", type=Path, required=True)
    build.add_argument("--out", type=Path, required=True)
    build.add_argument("--image", default=None, help="image name recorded as image_name (optional)")
    build.add_argument("--bake-into", type=Path, default=None, help="OCI layout: one instance image per row")
    find = commands.add_parser("discover", help="candidate FAIL_TO_PASS tests of a release pair")
    find.add_argument("--package", required=True)
    find.add_argument("--old", required=True)
    find.add_argument("--new", required=True)
    find.add_argument("--image", required=True)
    find.add_argument("--test-cmd", default="python3 -m pytest -rA --tb=no -p no:cacheprovider")
    find.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "rein-swebench-pypi")
    args = parser.parse_args(argv)
    if args.command == "build":
        print(build_instances(args.manifest, args.out, image=args.image, bake_into=args.bake_into))
    else:
        args.work.mkdir(parents=True, exist_ok=True)
        print(
            json.dumps(
                asyncio.run(discover(args.package, args.old, args.new, args.image, args.test_cmd, args.work))
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
