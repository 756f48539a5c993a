"""The trajectory viewer: page data, the ``rein view`` command, serving, and the page itself in headless
Chromium (loads, lists the run's trajectories, filters them, opens one on a real mouse click)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from components.trajectory_store import TrajectoryStore
from monitoring import viewer
from monitoring.train_logprobs import write_train_logprobs
from monitoring.viewer import ViewerLimits, build_page_data, serve_viewer, write_viewer
from tests.required_tools import require_tool

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1500,1000",
]
ALL_IDS = {
    "traj-ok-calc-0",
    "traj-fail-calc-1",
    "traj-compacted-strings",
    "traj-sandbox-died",
    "traj-ok-parse",
    "traj-grading-error",
}

needs_chromium = pytest.mark.usefixtures("chromium")


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Headless Chromium (skips locally, fails under CI=true when it is missing)."""
    return require_tool(CHROMIUM, "run `make setup-test` (apt-get install chromium)")


@pytest.fixture(scope="module")
def page(run_dir, tmp_path_factory) -> Path:
    """The viewer page of the test run, written by ``rein view`` with the tokenizer named in config.json."""
    out = tmp_path_factory.mktemp("viewer") / "index.html"
    assert viewer.main([str(run_dir), "--out", str(out)]) == 0
    return out


def embedded_data(page: Path) -> dict:
    html = page.read_text()
    match = re.search(r'<script type="application/json" id="rein-data">(.*?)</script>', html, re.S)
    return json.loads(match.group(1))


# ---- page data and the command ---------------------------------------------------------------------------------


def test_page_embeds_every_trajectory_with_decoded_tokens(page, run_dir, default_model_dir, tokenizer):
    data = embedded_data(page)
    assert {t["id"] for t in data["trajectories"]} == ALL_IDS
    assert data["run"]["tokenizer"] == str(default_model_dir)
    assert data["run"]["has_train_logprobs"] is True
    compacted = next(t for t in data["trajectories"] if t["id"] == "traj-compacted-strings")
    assert [s["reason"] for s in compacted["segments"]] == ["start", "history_rewritten"]
    # Every embedded id decodes exactly as the tokenizer decodes it.
    first = compacted["segments"][0]
    assert "".join(data["vocab"][str(i)] for i in first["ids"]).startswith(
        "<|im_start|>system\nYou are a careful"
    )
    assert first["mask"].count("1") == first["num_sampled"] > 0
    # Train logprobs were off by 0.8 nats on every fifth sampled token.
    assert compacted["logprob_diff_max"] == pytest.approx(0.8, abs=1e-3)


def test_page_is_self_contained(page):
    html = page.read_text()
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", html), "the page must not load anything"
    assert "https://" not in html.split('id="rein-data">')[0]
    # Hostile text in the data cannot close the data element.
    assert "<script>document.title" not in html
    assert "\\u003cscript>document.title" in html


def test_limits_cap_tokens_and_say_so(run_dir, tokenizer):
    data = build_page_data(
        run_dir, tokenizer=tokenizer, limits=ViewerLimits(max_tokens_per_trajectory=50, max_total_tokens=120)
    )
    shown = [sum(len(s["ids"]) for s in t["segments"]) for t in data["trajectories"]]
    assert max(shown) <= 50 and sum(shown) <= 120
    assert all(
        t["tokens_not_shown"] == t["num_tokens"] - n for t, n in zip(data["trajectories"], shown, strict=True)
    )
    assert data["run"]["limits"]["max_total_tokens"] == 120
    short = build_page_data(run_dir, limits=ViewerLimits(max_conversation_chars=150, max_log_chars=10))
    calc = next(t for t in short["trajectories"] if t["id"] == "traj-ok-calc-0")
    assert (
        calc["messages"][-1]["role"] == "note"
        and "more messages not embedded" in calc["messages"][-1]["content"]
    )
    assert len(calc["messages"]) < 7
    assert calc["log"].startswith("harne") and "characters not shown" in calc["log"]
    starved = build_page_data(run_dir, limits=ViewerLimits(max_total_text_chars=1))
    assert all(len(t["messages"]) <= 2 for t in starved["trajectories"])
    few = build_page_data(run_dir, tokenizer=None, limits=ViewerLimits(max_trajectories=2))
    assert few["run"]["num_listed"] == 2 and few["run"]["num_trajectories"] == 6
    assert {t["step"] for t in few["trajectories"]} == {2}, "the most recent steps are kept"
    assert few["vocab"] == {} and few["run"]["tokenizer"] is None


def test_step_selection(run_dir, tmp_path):
    out = tmp_path / "step1.html"
    assert viewer.main([str(run_dir), "--out", str(out), "--step", "1"]) == 0
    data = embedded_data(out)
    assert {t["id"] for t in data["trajectories"]} == {"traj-ok-calc-0", "traj-fail-calc-1"}
    assert data["run"]["steps"] == [1]


def test_train_logprobs_given_per_sampled_token_are_aligned(run_dir, tmp_path, tokenizer):
    copy = tmp_path / "run"
    shutil.copytree(run_dir / "trajectories", copy / "trajectories")
    (trajectory,) = [
        t for t in TrajectoryStore(copy).read_all().trajectories if t.trajectory_id == "traj-ok-parse"
    ]
    rollout = trajectory.segments[0].logprobs[trajectory.segments[0].loss_mask == 1]
    write_train_logprobs(copy, 0, [("traj-ok-parse", 0, rollout - 0.25)])
    data = build_page_data(copy, tokenizer=tokenizer)
    page = next(t for t in data["trajectories"] if t["id"] == "traj-ok-parse")
    assert page["logprob_diff_mean"] == pytest.approx(0.25, abs=1e-4)
    segment = page["segments"][0]
    sampled = [i for i, m in enumerate(segment["mask"]) if m == "1"]
    assert all(segment["tlp"][i] == pytest.approx(segment["lp"][i] - 0.25, abs=2e-4) for i in sampled)
    with pytest.raises(ValueError, match="finite"):
        write_train_logprobs(copy, 1, [("x", 0, [float("nan")])])
    assert write_train_logprobs(copy, 1, []) is None


def test_without_tokenizer_the_page_shows_ids_and_corrupt_shards_are_reported(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir / "trajectories", copy / "trajectories")
    (copy / "trajectories" / "shard-99999999999999999999-garbage.parquet").write_bytes(b"not parquet")
    out = write_viewer(copy)
    assert out == copy / "viewer" / "index.html"
    data = embedded_data(out)
    assert data["run"]["tokenizer"] is None and data["vocab"] == {}
    assert len(data["trajectories"]) == 6
    assert len(data["run"]["unreadable_shards"]) == 1 and "garbage" in data["run"]["unreadable_shards"][0]


def test_reading_a_live_run_leaves_its_temp_shards_alone(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir / "trajectories", copy / "trajectories")
    in_flight = copy / "trajectories" / ".tmp-shard-being-written.parquet"
    in_flight.write_bytes(b"partial")
    write_viewer(copy)
    assert in_flight.exists(), "the viewer must not delete a live writer's temp shard"


def test_command_rejects_bad_input(tmp_path, capsys):
    assert viewer.main([str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert viewer.main([str(tmp_path), "--port", "70000", "--serve"]) == 2
    assert viewer.main([str(tmp_path), "--max-tokens-per-trajectory", "0"]) == 2
    assert "max_tokens_per_trajectory" in capsys.readouterr().err
    assert viewer.main([str(tmp_path), "--model", str(tmp_path / "nope")]) == 2
    assert viewer.main(["--help"]) == 0


def test_rein_cli_dispatches_view(run_dir, tmp_path):
    from components.cli import main as rein

    out = tmp_path / "page.html"
    assert rein(["view", str(run_dir), "--out", str(out)]) == 0
    assert len(embedded_data(out)["trajectories"]) == 6


def test_serve_answers_over_http(page):
    server = serve_viewer(page, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        assert server.server_address[0] == "127.0.0.1"
        reply = httpx.get(f"http://127.0.0.1:{port}/{page.name}", timeout=10)
        assert reply.status_code == 200 and "rein-data" in reply.text
    finally:
        server.shutdown()
        server.server_close()


def test_rein_view_serve_from_the_command_line(run_dir, tmp_path):
    out = tmp_path / "served" / "index.html"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "monitoring.viewer",
            str(run_dir),
            "--out",
            str(out),
            "--serve",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = [process.stdout.readline(), process.stdout.readline()]
        url = re.search(r"serving (http://127\.0\.0\.1:\d+/index\.html)", lines[1]).group(1)
        reply = httpx.get(url, timeout=10)
        assert reply.status_code == 200 and "traj-ok-calc-0" in reply.text
    finally:
        process.terminate()
        process.wait(timeout=10)
        process.stdout.close()


# ---- the page in headless Chromium ------------------------------------------------------------------------------


def dump_dom(url: str, user_data_dir: Path) -> str:
    result = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@needs_chromium
def test_chromium_opens_the_trajectory_named_in_the_url(page, tmp_path):
    dom = dump_dom(page.as_uri() + "#t=traj-ok-calc-0", tmp_path / "profile")
    rows = re.findall(r'<tr data-id="([^"]+)"', dom)
    assert set(rows) == ALL_IDS
    assert re.search(r'<tr data-id="traj-ok-calc-0" class="selected"', dom)
    detail = dom[dom.index('id="detail"') :]
    assert "<h2>traj-ok-calc-0</h2>" in detail
    assert 'data-tool="str_replace"' in detail and "OUTPUT OF BASH" in detail.upper()
    assert "return a - b" in detail  # the tool output
    assert "grading: PASSED tests/test_calc.py::test_add" in detail  # the grading log
    assert 'class="reason">start<' in detail
    assert 'class="tok s"' in detail and 'class="tok p"' in detail
    assert "Fixed: add now returns a + b." in detail


class DevTools:
    """A minimal Chrome DevTools Protocol client over one page's websocket."""

    def __init__(self, websocket_url: str) -> None:
        from websockets.sync.client import connect

        self._socket = connect(websocket_url, max_size=64 * 1024 * 1024, open_timeout=30)
        self._next_id = 0

    def call(self, method: str, **params):
        self._next_id += 1
        self._socket.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv(timeout=60))
            if message.get("id") == self._next_id:
                assert "error" not in message, message
                return message["result"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 30):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {expression}")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed + released) at the element's centre."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center'}});"
            " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def close(self) -> None:
        self._socket.close()


@pytest.fixture
def browser(tmp_path):
    """Headless Chromium with remote debugging on a free port; yields a function opening a page."""
    profile = tmp_path / "profile"
    process = subprocess.Popen(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    clients: list[DevTools] = []
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert process.poll() is None, "chromium exited early"
            assert time.monotonic() < deadline, "chromium did not open its debugging port"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])

        def open_page(url: str) -> DevTools:
            target = httpx.put(f"http://127.0.0.1:{port}/json/new?{url}", timeout=30).json()
            client = DevTools(target["webSocketDebuggerUrl"])
            clients.append(client)
            return client

        yield open_page
    finally:
        for client in clients:
            client.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@needs_chromium
@pytest.mark.slow
def test_chromium_lists_filters_and_opens_a_trajectory_on_click(browser, page, tmp_path):
    tab = browser(page.as_uri())
    tab.wait_for("document.body && document.body.dataset.ready === '1'")
    title = tab.evaluate("document.title")
    rows = tab.evaluate("[...document.querySelectorAll('#trajectory-rows tr')].map(r => r.dataset.id)")
    assert set(rows) == ALL_IDS
    assert "Select a trajectory" in tab.evaluate("document.getElementById('detail').textContent")

    # Filters: status, then reward range, then task.
    def visible_after(script: str) -> set[str]:
        tab.evaluate(script)
        return set(
            tab.evaluate("[...document.querySelectorAll('#trajectory-rows tr')].map(r => r.dataset.id)")
        )

    set_select = "(() => {{ const s = document.getElementById('{0}'); s.value = '{1}'; s.dispatchEvent(new Event('change')); }})()"
    set_input = "(() => {{ const s = document.getElementById('{0}'); s.value = '{1}'; s.dispatchEvent(new Event('input')); }})()"
    assert visible_after(set_select.format("filter-status", "ok")) == {
        "traj-ok-calc-0",
        "traj-fail-calc-1",
        "traj-ok-parse",
    }
    assert visible_after(set_input.format("filter-reward-min", "0.5")) == {"traj-ok-calc-0", "traj-ok-parse"}
    assert visible_after(set_select.format("filter-task", "calc")) == {"traj-ok-calc-0"}
    visible_after(set_select.format("filter-status", "") + ";" + set_input.format("filter-reward-min", ""))
    assert visible_after(set_select.format("filter-task", "strings")) == {
        "traj-compacted-strings",
        "traj-sandbox-died",
    }

    # A real click on a row opens the trajectory.
    tab.click('tr[data-id="traj-compacted-strings"]')
    tab.wait_for("location.hash === '#t=traj-compacted-strings'")
    detail = tab.wait_for(
        "document.querySelector('#detail h2') && document.querySelector('#detail h2').textContent === "
        "'traj-compacted-strings' && document.getElementById('detail').innerText"
    )
    assert "ran past 2 turns" in detail and "turn_limit" in detail
    assert "Summary so far: calc.py read. Continue." in detail
    assert tab.evaluate(
        "[...document.querySelectorAll('.segment-boundary .reason')].map(e => e.textContent)"
    ) == [
        "start",
        "history_rewritten",
    ]
    # the lineage tree: the compacted conversation drawn under the segment it resumes
    assert tab.evaluate(
        "[...document.querySelectorAll('#lineage li')].map(li => [li.dataset.segment, "
        "li.parentElement.closest('li') ? li.parentElement.closest('li').dataset.segment : null, "
        "li.querySelector('.kind').textContent])"
    ) == [["0", None, "root"], ["1", "0", "compaction"]]
    assert "compaction of segment 0 at token" in tab.evaluate(
        "document.querySelectorAll('.segment-boundary')[1].textContent"
    )
    token_text = tab.evaluate("document.querySelector('#tokens .segment .tokens').textContent")
    assert token_text.startswith("<|im_start|>system↵\nYou are a careful software engineer.")
    assert tab.evaluate("document.querySelectorAll('#tokens .tok.s').length") == 35
    assert "harness: turn limit reached" in tab.evaluate("document.getElementById('log').textContent")

    # Colour by |train - rollout|: the tokens off by 0.8 nats turn red, the others stay green.
    tab.click("#colour-diff")
    colours = tab.wait_for(
        "(() => { const c = [...document.querySelectorAll('#tokens .tok.s')].map(e => e.style.backgroundColor);"
        " return c.every(x => x) && c; })()"
    )
    channels = [tuple(int(c) for c in re.findall(r"\d+", colour)) for colour in colours]
    reddish = [r > g for r, g, _ in channels]
    data = embedded_data(page)
    segments = next(t for t in data["trajectories"] if t["id"] == "traj-compacted-strings")["segments"]
    assert sum(reddish) == sum((s["num_sampled"] + 4) // 5 for s in segments)  # every fifth sampled token
    assert len(set(colours)) == 2

    # Hostile conversation text is shown as text, never run.
    tab.evaluate("location.hash = 't=traj-fail-calc-1'")
    detail = tab.wait_for(
        "document.querySelector('#detail h2').textContent === 'traj-fail-calc-1' && "
        "document.getElementById('conversation').innerText"
    )
    assert "<script>document.title='pwned'</script>" in detail
    assert tab.evaluate("document.querySelectorAll('#detail img, #detail script, #detail b').length") == 0
    assert tab.evaluate("document.title") == title

    # A screenshot for people (and for this test: a real, non-trivial PNG).
    tab.evaluate("location.hash = 't=traj-ok-calc-0'")
    tab.wait_for("document.querySelector('#detail h2').textContent === 'traj-ok-calc-0'")
    png = base64.b64decode(tab.call("Page.captureScreenshot", format="png")["data"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    (tmp_path / "viewer.png").write_bytes(png)


@needs_chromium
def test_chromium_shows_an_empty_run_and_an_unknown_trajectory(tmp_path):
    (tmp_path / "run").mkdir()
    page = write_viewer(tmp_path / "run")
    dom = dump_dom(page.as_uri() + "#t=no-such-trajectory", tmp_path / "profile")
    assert "This run has no trajectories yet." in dom
    assert "No trajectory no-such-trajectory in this run." in dom
    assert "<tr data-id=" not in dom
