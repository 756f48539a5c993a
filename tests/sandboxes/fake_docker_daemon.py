"""A local fake of the Docker Engine API (the subset ``sandboxes/docker_backend.py`` uses), served over a Unix
socket to the official ``docker`` client: ``/images/load``, ``/images/{name}/json``, ``/containers/create``,
``/containers/{id}/start|json|exec|archive``, ``DELETE /containers/{id}``, ``/exec/{id}/start`` (the
multiplexed raw stream: 8-byte frame headers, stream 1 = stdout, 2 = stderr) and ``/exec/{id}/json``. Each
container is a real image sandbox (bubblewrap on the loaded image's root filesystem), so commands really run
in the image; the create request is recorded for assertions."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import re
import socketserver
import struct
import tarfile
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from components.protocols import SandboxLimits, SandboxSpec
from sandboxes.image import ImageSandboxConfig, create_image_sandbox


class FakeDockerDaemon:
    """``with FakeDockerDaemon(directory) as daemon:`` then ``docker.DockerClient(base_url=daemon.url)``."""

    def __init__(self, directory: Path, image_cache: Path) -> None:
        self.directory = Path(directory)
        self.socket_path = str(self.directory / "docker.sock")
        self.image_config = ImageSandboxConfig(cache_dir=image_cache)
        self.images: dict[str, Path] = {}  # image id -> saved archive
        self.containers: dict[str, object] = {}  # container id -> sandbox
        self.created: list[dict] = []  # create request bodies
        self.execs: dict[str, dict] = {}
        self.removed: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server = _Server(self.socket_path, _Handler)
        self._server.daemon = self
        self._server_thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=600)

    def __enter__(self) -> FakeDockerDaemon:
        self._loop_thread.start()
        self._server_thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.shutdown()
        self._server.server_close()
        for sandbox in list(self.containers.values()):
            self.run(sandbox.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=10)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    daemon: FakeDockerDaemon


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection: the raw exec stream ends with the connection

    def log_message(self, *args) -> None:  # quiet
        pass

    @property
    def fake(self) -> FakeDockerDaemon:
        return self.server.daemon

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json(self, status: int, payload, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _route(self) -> tuple[str, dict]:
        parsed = urlparse(self.path)
        return re.sub(r"^/v[0-9.]+", "", parsed.path), parse_qs(parsed.query)

    def do_POST(self) -> None:
        path, _ = self._route()
        body = self._body()
        if path == "/images/load":
            image_id = "sha256:" + hashlib.sha256(body).hexdigest()
            archive = self.fake.directory / f"{image_id[7:19]}.tar"
            archive.write_bytes(body)
            self.fake.images[image_id] = archive
            return self._json(200, {"stream": f"Loaded image ID: {image_id}\n"})
        if path == "/containers/create":
            request = json.loads(body)
            self.fake.created.append(request)
            archive = self.fake.images.get(request["Image"])
            if archive is None:
                return self._json(404, {"message": f"No such image: {request['Image']}"})
            spec = SandboxSpec(root_image=f"docker-archive:{archive}", limits=SandboxLimits(workspace_mb=128))
            sandbox = self.fake.run(create_image_sandbox(spec, self.fake.image_config))
            container_id = hashlib.sha256(sandbox.sandbox_id.encode()).hexdigest()
            self.fake.containers[container_id] = sandbox
            return self._json(201, {"Id": container_id, "Warnings": []})
        match = re.fullmatch(r"/containers/([0-9a-f]+)/(start|exec)", path)
        if match:
            container_id, action = match.groups()
            if container_id not in self.fake.containers:
                return self._json(404, {"message": "No such container"})
            if action == "start":
                self.send_response(204)
                self.end_headers()
                return None
            exec_id = hashlib.sha256(f"{container_id}{len(self.fake.execs)}".encode()).hexdigest()
            self.fake.execs[exec_id] = {"container": container_id, **json.loads(body)}
            return self._json(201, {"Id": exec_id})
        match = re.fullmatch(r"/exec/([0-9a-f]+)/start", path)
        if match:
            record = self.fake.execs[match.group(1)]
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.docker.raw-stream")
            self.end_headers()
            self.wfile.flush()
            sandbox = self.fake.containers[record["container"]]
            env = dict(item.split("=", 1) for item in record.get("Env") or [])
            result = self.fake.run(
                sandbox.exec(record["Cmd"], cwd=record.get("WorkingDir") or None, env=env, timeout_s=600)
            )
            # Docker reports a process killed by signal N as 128 + N (Python's convention is -N).
            record["ExitCode"] = 128 - result.exit_code if result.exit_code < 0 else result.exit_code
            for stream, text in ((1, result.stdout), (2, result.stderr)):
                data = text.encode()
                if data:
                    self.wfile.write(struct.pack(">BxxxL", stream, len(data)) + data)
            return None
        return self._json(404, {"message": f"fake daemon: no route POST {path}"})

    def do_GET(self) -> None:
        path, query = self._route()
        match = re.fullmatch(r"/images/(.+)/json", path)
        if match:
            image_id = match.group(1)
            if image_id not in self.fake.images:
                return self._json(404, {"message": "No such image"})
            return self._json(200, {"Id": image_id, "RepoTags": []})
        match = re.fullmatch(r"/containers/([0-9a-f]+)/json", path)
        if match:
            return self._json(
                200, {"Id": match.group(1), "Name": "/rein", "State": {"Running": True}, "Config": {}}
            )
        match = re.fullmatch(r"/exec/([0-9a-f]+)/json", path)
        if match:
            record = self.fake.execs[match.group(1)]
            return self._json(
                200, {"ID": match.group(1), "Running": False, "ExitCode": record.get("ExitCode")}
            )
        match = re.fullmatch(r"/containers/([0-9a-f]+)/archive", path)
        if match:
            sandbox = self.fake.containers[match.group(1)]
            remote = query["path"][0]
            try:
                archive = self.fake.run(sandbox.download_archive(remote))
            except FileNotFoundError as exc:
                return self._json(404, {"message": str(exc)})
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                member = tar.next()
            stat = {
                "name": member.name,
                "size": member.size,
                "mode": member.mode,
                "mtime": "",
                "linkTarget": "",
            }
            self.send_response(200)
            self.send_header("Content-Type", "application/x-tar")
            self.send_header("Content-Length", str(len(archive)))
            self.send_header(
                "X-Docker-Container-Path-Stat", base64.b64encode(json.dumps(stat).encode()).decode()
            )
            self.end_headers()
            self.wfile.write(archive)
            return None
        return self._json(404, {"message": f"fake daemon: no route GET {path}"})

    def do_PUT(self) -> None:
        path, query = self._route()
        match = re.fullmatch(r"/containers/([0-9a-f]+)/archive", path)
        if not match:
            return self._json(404, {"message": f"fake daemon: no route PUT {path}"})
        sandbox = self.fake.containers[match.group(1)]
        self.fake.run(sandbox.upload_archive(self._body(), query["path"][0]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
        return None

    def do_DELETE(self) -> None:
        path, _ = self._route()
        match = re.fullmatch(r"/containers/([0-9a-f]+)", path)
        sandbox = self.fake.containers.pop(match.group(1), None) if match else None
        if sandbox is None:
            return self._json(404, {"message": "No such container"})
        self.fake.run(sandbox.close())
        self.fake.removed.append(match.group(1))
        self.send_response(204)
        self.end_headers()
        return None
