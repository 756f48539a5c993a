"""Before a sync step rolls out replacements (of groups lost to infrastructure: ``partial_groups.py``; or of
uninformative ones), a fleet whose servers died is given the time to get one back: rollouts that die on a dead
server become ``engine_error`` (never trained), but replacements sent before the server returned would only die
the same way. ``ServerFleet.await_live_server`` waits (bounded) and has the server re-pushed the run's weights."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class AwaitsLiveServer(Protocol):
    """An engine over servers that can die and come back (``ServerFleet``)."""

    async def await_live_server(self) -> None:
        """Return once a server is live with the run's weights (checking the live ones first); ``EngineError``
        naming them after a bound."""
        ...


async def before_replacements(engine: object) -> None:
    """Wait until ``engine`` (when it is ``AwaitsLiveServer``) has a live server again."""
    if isinstance(engine, AwaitsLiveServer):
        await engine.await_live_server()
