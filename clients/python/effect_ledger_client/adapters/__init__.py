"""Framework adapters: each imports its framework itself, so the base package needs none."""
