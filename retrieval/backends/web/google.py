"""Backend `google`: Google's results bought from the SERP provider `google_provider` names."""

from __future__ import annotations

from searchrl.retrieval.backends.web.backend import WebBackend
from searchrl.retrieval.backends.web.serpapi import SerpApiBackend
from searchrl.retrieval.backends.web.serper import SerperBackend
from searchrl.retrieval.settings import RetrievalSettings


class GoogleBackend:
    """Backend `google`: Google's results from the SERP provider `google_provider` names (Serper or SerpAPI)."""

    @classmethod
    def from_settings(cls, settings: RetrievalSettings) -> WebBackend:
        impl: type[SerperBackend] | type[SerpApiBackend] = (
            SerpApiBackend if settings.google_provider == "serpapi" else SerperBackend
        )
        backend = impl.from_settings(settings)
        backend.name = "google"  # what GET / reports; info() adds the provider
        backend.provider = impl.name
        return backend


__all__ = ["GoogleBackend"]
