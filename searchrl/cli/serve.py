"""`searchrl serve`: run the retrieval service in the foreground.

    searchrl serve --backend bm25 --port 8000          # loopback, no key needed
    RETRIEVAL_API_KEY=... searchrl serve --host 0.0.0.0   # public bind needs a key (or --insecure)

The API key is read from the environment (RETRIEVAL_API_KEY) or a file (RETRIEVAL_API_KEY_FILE: the token on
line 1, the previous one on line 2 during a rotation) only: a flag would put it in argv and `ps`. Limits,
timeouts and readiness knobs are SEARCHRL_RETRIEVAL_* variables (docs/operations.md).
"""

from __future__ import annotations

import argparse

from searchrl.cli.flags import add_flags, retrieval_settings, verb


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = verb(sub, "serve", _serve)
    p.add_argument(
        "--backend",
        help="bm25 | dense | hybrid | google (Serper/SerpAPI) | serper | serpapi | searxng | google-cse (default: bm25)",
    )
    p.add_argument(
        "--host",
        help="bind address (default 127.0.0.1; public needs RETRIEVAL_API_KEY or RETRIEVAL_API_KEY_FILE)",
    )
    p.add_argument("--port", type=int, help="port (default 8000)")
    add_flags(p, "corpus", "data_dir")
    p.add_argument("--index-dir", dest="index_dir", help="explicit index directory")
    add_flags(p, "encoder", "index_type")
    p.add_argument("--topk", type=int, help="default results per query (default 3)")
    p.add_argument("--insecure", action="store_true", help="allow a public bind without an API key")
    p.add_argument(
        "--no-build",
        dest="build_if_missing",
        action="store_false",
        help="fail instead of building a missing index",
    )


def _serve(args: argparse.Namespace) -> int:
    """run the retrieval service (POST /retrieve)

    Run the retrieval service in the foreground; builds the index on first use.
    """
    from searchrl.logs import setup_logging
    from searchrl.retrieval.serving.server import run_server

    setup_logging()
    settings = retrieval_settings(
        args,
        "backend",
        "host",
        "port",
        "corpus",
        "data_dir",
        "index_dir",
        "encoder",
        "index_type",
        "topk",
        "insecure",
        "build_if_missing",
    )
    run_server(settings)
    return 0
