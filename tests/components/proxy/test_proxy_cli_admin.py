"""``rein proxy --admin-key``: the isolated mode through the real command (a subprocess) — session control
needs the admin key, and each session's model routes take only that session's own token."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

pytestmark = pytest.mark.timeout(300)

REIN = Path(sys.executable).parent / "rein"
ADMIN_KEY = "admin-" + "k" * 40


def test_rein_proxy_admin_key_separates_control_from_model_routes(tiny_model_dir, tmp_path):
    command = [str(REIN), "proxy", "--model", str(tiny_model_dir), "--port", "0", "--admin-key", ADMIN_KEY]
    proxy = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines: list[str] = []
        match = None
        while match is None:
            line = proxy.stdout.readline()
            assert line, "".join(lines)[-3000:]
            lines.append(line)
            match = re.search(r"^rein proxy: .* at (http://\S+) \(context window", line)
        url = match.group(1)
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        assert httpx.post(f"{url}/sessions").status_code == 401  # no key: no session control
        session = httpx.post(f"{url}/sessions", headers=admin).json()
        token, session_id = session["api_key"], session["session_id"]
        assert token != ADMIN_KEY
        client = openai.OpenAI(base_url=f"{url}/s/{session_id}/v1", api_key=token, max_retries=0)
        reply = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert reply.usage.completion_tokens >= 1
        with pytest.raises(openai.AuthenticationError):  # a made-up key reaches nothing
            openai.OpenAI(base_url=f"{url}/s/{session_id}/v1", api_key="guess", max_retries=0).models.list()
        token_only = {"Authorization": f"Bearer {token}"}
        for path in (f"/s/{session_id}/finalize", f"/s/{session_id}/discard", "/sessions"):
            assert httpx.post(f"{url}{path}", headers=token_only, json={}).status_code == 401, path
        assert httpx.post(f"{url}/s/{session_id}/finalize", headers=admin, json={}).json()["status"] == "ok"
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)


def test_rein_proxy_without_a_key_is_closed_and_hands_the_key_to_the_host_only(tiny_model_dir, tmp_path):
    """Secure by default (issue #28.8): no key given, a fresh one is generated and written to
    ``--admin-key-file`` readable by the host user only (0600), never printed to stdout; every route is closed
    to a caller without it."""
    key_file = tmp_path / "keys" / "admin.key"
    key_file.parent.mkdir()
    key_file.write_text("stale\n")
    key_file.chmod(0o644)  # an existing world-readable file is made private before the key goes in
    command = [
        str(REIN),
        "proxy",
        "--model",
        str(tiny_model_dir),
        "--port",
        "0",
        "--admin-key-file",
        str(key_file),
    ]
    with open(tmp_path / "stderr.txt", "w+") as stderr:
        proxy = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            line = proxy.stdout.readline()
            match = re.search(r"^rein proxy: .* at (http://\S+) \(context window", line)
            assert match, line + (tmp_path / "stderr.txt").read_text()[-3000:]
            url = match.group(1)
            assert key_file.stat().st_mode & 0o777 == 0o600
            admin_key = key_file.read_text().strip()
            assert len(admin_key) >= 32 and admin_key != "stale"
            for method, path in (("POST", "/sessions"), ("GET", "/health"), ("GET", "/v1/models")):
                assert httpx.request(method, url + path).status_code == 401, path
            admin = {"Authorization": f"Bearer {admin_key}"}
            session = httpx.post(f"{url}/sessions", headers=admin).json()
            assert session["api_key"] != admin_key
            assert httpx.post(f"{url}/s/{session['session_id']}/discard", headers=admin).status_code == 200
        finally:
            proxy.terminate()
            rest, _ = proxy.communicate(timeout=30)
        stderr.seek(0)
        assert admin_key not in line + rest and admin_key not in stderr.read()  # the file is its only copy


def test_rein_proxy_open_control_plane_needs_its_named_flag_alone():
    """The opt-out is loud and exclusive: combined with a key it is refused before anything starts."""
    command = [str(REIN), "proxy", "--insecure-open-control-plane", "--api-key", "k"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2 and "insecure_open_control_plane" in completed.stderr, completed.stderr
    assert "INSECURE" in subprocess.run([str(REIN), "proxy", "--help"], capture_output=True, text=True).stdout
