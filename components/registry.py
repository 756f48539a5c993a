"""One registry per seam: a *kind* is a registered config class whose ``build()`` makes the brick.

A name lives only here, at the edge where a person types one (``--proxy local``, ``engine: {kind: sglang}``);
everything below gets the built object. A built-in brick registers its config class where it is defined::

    @PROXIES.register("serve")
    @dataclass(kw_only=True, frozen=True)
    class ServeProxyConfig:
        replicas: int = option(2, "Ray Serve replicas of the proxy")

        def build(self) -> ProxyProvider:
            return ServeProxyProvider(num_replicas=self.replicas)

A third-party brick registers with no edit of Rein, through the Python entry point group ``rein.bricks``:
the entry point's name is ``<seam>.<kind>`` and its object the config class, e.g. in its ``pyproject.toml``::

    [project.entry-points."rein.bricks"]
    "harness.one_shot" = "my_package.one_shot:OneShotHarnessConfig"

A registry imports its built-in modules and reads the entry points the first time it is asked for its kinds,
so importing a seam costs nothing until a name is looked up.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeVar

ENTRY_POINT_GROUP = "rein.bricks"

ConfigT = TypeVar("ConfigT")
ClassT = TypeVar("ClassT", bound=type)


class Registry(Generic[ConfigT]):
    """The kinds of one seam (``engine``, ``proxy``, ``sandbox``, ``harness``, ``tasks``, ``reward``,
    ``algorithm``, ``logger``): name → config class."""

    def __init__(self, seam: str, *, builtin_modules: Iterable[str] = ()) -> None:
        self.seam = seam
        self._builtin_modules = tuple(builtin_modules)
        self._classes: dict[str, type[ConfigT]] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[ClassT], ClassT]:
        """Class decorator: ``name`` picks this config class (a name taken by another class is an error)."""

        def decorate(config_class: ClassT) -> ClassT:
            self.add(name, config_class)
            return config_class

        return decorate

    def add(self, name: str, config_class: type[ConfigT]) -> None:
        """Register ``config_class`` as kind ``name``."""
        if not callable(getattr(config_class, "build", None)):
            raise TypeError(f"{self.seam} kind {name!r}: {config_class.__qualname__} has no build() method")
        known = self._classes.get(name)
        if known is not None and _qualified(known) != _qualified(config_class):
            raise ValueError(f"{self.seam}: kind {name!r} is taken by {_qualified(known)}")
        self._classes[name] = config_class

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for module in self._builtin_modules:
            importlib.import_module(module)
        for entry_point in _entry_points():
            seam, _, kind = entry_point.name.partition(".")
            if seam == self.seam and kind and kind not in self._classes:
                self.add(kind, entry_point.load())

    def kinds(self) -> tuple[str, ...]:
        """Every registered kind, sorted."""
        self._load()
        return tuple(sorted(self._classes))

    def get(self, name: str) -> type[ConfigT]:
        """The config class of kind ``name``; ``ValueError`` naming the seam and every registered kind."""
        self._load()
        if name not in self._classes:
            raise ValueError(f"{self.seam}: must be one of {list(self.kinds())}, got {name!r}")
        return self._classes[name]

    def name_of(self, config: object) -> str:
        """The kind ``config`` (an instance of a registered class) is registered as."""
        self._load()
        for name, config_class in self._classes.items():
            if type(config) is config_class:
                return name
        raise ValueError(
            f"{self.seam}: {type(config).__qualname__} is no registered kind ({list(self.kinds())})"
        )

    def holds(self, config: object) -> bool:
        """Whether ``config`` is an instance of one of this seam's registered classes."""
        self._load()
        return any(type(config) is config_class for config_class in self._classes.values())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.kinds()

    def __iter__(self) -> Iterator[str]:
        return iter(self.kinds())

    def build(self, name: str) -> object:
        """The brick kind ``name`` builds with its default config."""
        return self.get(name)().build()


@functools.cache
def _entry_points() -> tuple[EntryPoint, ...]:
    """The ``rein.bricks`` entry points of every installed distribution (read once per process)."""
    return tuple(entry_points(group=ENTRY_POINT_GROUP))


def _qualified(config_class: type) -> str:
    return f"{config_class.__module__}.{config_class.__qualname__}"


# The seams' registries (built-in kinds are registered by the modules named here, where each brick lives).
ENGINES: Registry = Registry("engine", builtin_modules=("components.engine.providers",))
PROXIES: Registry = Registry("proxy", builtin_modules=("components.proxy.providers",))
SANDBOXES: Registry = Registry("sandbox", builtin_modules=("sandboxes.provider",))
HARNESSES: Registry = Registry(
    "harness",
    builtin_modules=(
        "harnesses.swe_agent",
        "harnesses.mini_swe_agent",
        "harnesses.claude_code",
        "harnesses.codex",
        "harnesses.opencode",
        "harnesses.openclaw",
        "harnesses.qwen_code",
        "harnesses.gemini_cli",
    ),
)
TASK_SOURCES: Registry = Registry("tasks", builtin_modules=("components.tasks.sources",))
REWARDS: Registry = Registry("reward", builtin_modules=("components.rewards.config",))
ALGORITHMS: Registry = Registry(
    "algorithm",
    builtin_modules=(
        "components.training.algorithms.grpo",
        "components.training.algorithms.dr_grpo",
        "components.training.algorithms.gspo",
        "components.training.algorithms.rloo",
    ),
)
LOGGERS: Registry = Registry("logger", builtin_modules=("monitoring.logger",))
SEAMS: tuple[Registry, ...] = (
    ENGINES,
    PROXIES,
    SANDBOXES,
    HARNESSES,
    TASK_SOURCES,
    REWARDS,
    ALGORITHMS,
    LOGGERS,
)


def registry_of(config: object) -> Registry | None:
    """The seam whose registered kind ``config`` is (None: no registered kind)."""
    return next((registry for registry in SEAMS if registry.holds(config)), None)
