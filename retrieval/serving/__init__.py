"""The serving room: the retrieval service itself, the process `searchrl serve` runs.

    app.py         `create_app(settings)`: the FastAPI app, its lifespan and routes (parts in api/)
    server.py      uvicorn in the foreground: header deadline, connection limit, graceful drain
    endpoint.py    POST /retrieve as a plain ASGI handler, the hot path
    batcher.py     cross-request micro-batching, in-flight de-duplication, the bounded queue
    cache.py       the persistent query cache (SQLite) in front of any backend, record/replay
    validation.py  the /retrieve request model with this server's limits, and the one error body
    metrics.py     Prometheus `/metrics`                ratelog.py   rate-limited, aggregated log lines

Only the service's own rooms (serving/, api/, backends/) and the entry point that starts it (`searchrl serve`,
searchrl/cli/serve.py) import it: a trainer, an inference run or an index build never loads the service
(tests/retrieval/test_rooms.py).
"""
