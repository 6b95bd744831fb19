"""Example trainers (``python -m longhaul.examples.chars``)."""
