"""searchrl: train LLM agents to use a search engine with RL (Search-R1 recipe, GRPO on verl).

This package is the glue every area shares (errors, logging, prompt, scoring, CLI). It imports nothing
heavy, so `searchrl --help` stays fast; faiss, torch and verl are imported only where they are used.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
