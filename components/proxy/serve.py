"""The proxy as a Ray Serve deployment: one application per harness, all sharing the session shards (and
through them the engine handle).

    registry = start_session_shards(RayEngineClient(engine_handle), tokenizer_path, config, num_shards=2)
    url = run_proxy_on_serve(registry, config, app_name="proxy-claude", route_prefix="/proxy/claude")
    # harness base URL for a session: f"{url}/s/{session_id}"

Replicas are stateless translators (see ``components.proxy.ray_sessions``), so ``num_replicas`` can be any
number and requests need no sticky routing. Start Serve yourself (``serve.start(http_options=...)``) to choose
its host/port; otherwise ``serve.run`` starts it on Serve's default port.
"""

from __future__ import annotations

from ray import serve

from components.config import require, require_positive
from components.proxy.app import build_app
from components.proxy.config import ProxyConfig
from components.proxy.ray_sessions import ShardedSessionRegistry


@serve.ingress()
class ProxyDeployment:
    """One Serve replica: the proxy's FastAPI app over the shared session shards."""

    def __init__(self, registry: ShardedSessionRegistry, config: ProxyConfig) -> None:
        self._app = build_app(registry, config)

    def __serve_build_asgi_app__(self):
        return self._app


def build_proxy_deployment(
    registry: ShardedSessionRegistry,
    config: ProxyConfig | None = None,
    *,
    num_replicas: int = 2,
    name: str = "rein-proxy",
    max_ongoing_requests: int = 256,
) -> serve.Application:
    """A bound Serve application of the proxy (pass it to ``serve.run``)."""
    require_positive(num_replicas, "num_replicas")
    require_positive(max_ongoing_requests, "max_ongoing_requests")
    deployment = serve.deployment(
        ProxyDeployment,
        name=name,
        num_replicas=num_replicas,
        max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={"num_cpus": 0},
    )
    return deployment.bind(registry, config or ProxyConfig())


def serve_http_url() -> str:
    """``http://HOST:PORT`` of the running Serve HTTP proxy."""
    from ray.serve.context import _get_global_client

    http = _get_global_client().http_config
    host = "127.0.0.1" if http.host in ("0.0.0.0", "", None) else http.host
    return f"http://{host}:{http.port}"


def run_proxy_on_serve(
    registry: ShardedSessionRegistry,
    config: ProxyConfig | None = None,
    *,
    app_name: str = "rein-proxy",
    route_prefix: str = "/proxy",
    num_replicas: int = 2,
) -> str:
    """Deploy the proxy as Serve application ``app_name`` at ``route_prefix``; returns its base URL."""
    require(route_prefix.startswith("/"), "route_prefix", f"must start with '/', got {route_prefix!r}")
    app = build_proxy_deployment(registry, config, num_replicas=num_replicas, name=f"{app_name}-deployment")
    serve.run(app, name=app_name, route_prefix=route_prefix)
    return serve_http_url() + route_prefix.rstrip("/")
