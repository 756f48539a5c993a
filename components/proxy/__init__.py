"""The inference proxy: OpenAI Chat Completions, OpenAI Responses and Anthropic Messages on one server, every
turn recorded token for token by the TITO core.

- ``components.proxy.app.build_app(registry, config)``: the FastAPI app (routes and error shapes documented there).
- ``components.proxy.sessions``: ``SessionRegistry`` (the Python API: ``open_session``, ``run_turn``,
  ``describe``, ``finalize``, ``discard``) and ``LocalSessionRegistry`` (in-process sessions).
- ``components.proxy.ray_sessions``: session shards (Ray actors) + ``ShardedSessionRegistry`` for Serve.
- ``components.proxy.serve``: the Ray Serve deployment (``build_proxy_deployment``, ``run_proxy_on_serve``).
- ``components.proxy.server.ProxyServer``: standalone uvicorn; ``components.proxy.cli``: ``rein proxy``.

Submodules are imported on demand (Ray Serve is heavy).
"""
