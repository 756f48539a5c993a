"""Recipes: short, linear training scripts (``python recipes/<name>.py --help``)."""
