"""A recipe's command line: parse it into the recipe's config and run the recipe, a user's mistake or a fault the
run did not survive said in one line (the traceback goes to the run directory's ``logs/driver.log``)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from components.errors import ReinError

logger = logging.getLogger("rein.recipe")


def main_entry(main: Callable[[Any], Awaitable[Any]], config_class: type, description: str) -> None:
    """Parse the command line into ``config_class`` and run ``main(config)``."""
    import asyncio

    from components.recipe_config import parse_config

    config = parse_config(config_class, sys.argv[1:], description=description)
    try:
        asyncio.run(main(config))
    except ValueError as error:  # a value only checkable at run time (e.g. an unknown task id): no traceback
        logger.info("run stopped", exc_info=True)  # the traceback goes to logs/driver.log only
        sys.exit(f"{Path(sys.argv[0]).name}: error: {error}")
    except ReinError as error:  # a fault the run did not survive (a sandbox backend down, a server gone)
        logger.info("run stopped", exc_info=True)  # the traceback: logs/driver.log only
        cause = getattr(error, "cause", None)  # raised in a Ray actor: Ray's wrapper carries the original
        error = cause if isinstance(cause, ReinError) else error
        sys.exit(
            f"{Path(sys.argv[0]).name}: the run stopped: {type(error).__name__}: {error} (traceback in the run "
            "directory's logs/driver.log; the same command resumes the run from its last checkpoint)"
        )
