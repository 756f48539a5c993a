"""Recipe tests run the recipes as subprocesses, like users do."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
