"""Import the plugin from its folder when the distribution is not installed."""

import importlib.util
import pathlib
import sys

if importlib.util.find_spec("keynorm_plugin") is None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
