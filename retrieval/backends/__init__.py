"""Backend registry: `build_backend(settings)` picks the implementation named by `settings.backend`.

Implementations are imported lazily so a BM25-only server never imports torch or faiss.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from searchrl.errors import ConfigError
from searchrl.retrieval.backends.base import Backend

if TYPE_CHECKING:
    from searchrl.retrieval.settings import RetrievalSettings

# name -> "module:Class"; each class has `from_settings(settings) -> Backend`
_REGISTRY: dict[str, str] = {
    "dense": "searchrl.retrieval.backends.dense:DenseBackend",
    "bm25": "searchrl.retrieval.backends.bm25:BM25Backend",
    "hybrid": "searchrl.retrieval.backends.hybrid:HybridBackend",
    "google": "searchrl.retrieval.backends.web.google:GoogleBackend",  # Google results via Serper or SerpAPI
    "google-cse": "searchrl.retrieval.backends.web.cse:GoogleCSEBackend",  # closing 2027-01-01
    "serper": "searchrl.retrieval.backends.web.serper:SerperBackend",
    "serpapi": "searchrl.retrieval.backends.web.serpapi:SerpApiBackend",
    "searxng": "searchrl.retrieval.backends.web.searxng:SearxngBackend",
}


def build_backend(settings: RetrievalSettings) -> Backend:
    """Construct (not start) the backend the settings name, behind the query cache unless cache_mode is off."""
    if getattr(settings, "cache_mode", "off") != "off":
        if settings.backend not in _REGISTRY:
            _build_uncached(settings)  # raises the unknown-backend ConfigError
        from searchrl.retrieval.serving.cache import build_cached_backend

        return build_cached_backend(settings, _build_uncached)
    return _build_uncached(settings)


def _build_uncached(settings: RetrievalSettings) -> Backend:
    try:
        target = _REGISTRY[settings.backend]
    except KeyError:
        raise ConfigError(
            f"unknown backend {settings.backend!r}; choose one of {', '.join(sorted(_REGISTRY))}"
        ) from None
    module_name, _, cls_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"backend {settings.backend!r} needs extra packages ({exc.name}): pip install -e '.[retrieval]'"
        ) from exc
    cls = getattr(module, cls_name)
    backend: Backend = cls.from_settings(settings)
    return backend


__all__ = ["Backend", "build_backend"]
