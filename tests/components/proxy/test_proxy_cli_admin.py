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
