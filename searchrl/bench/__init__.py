"""Benchmarks of the retrieval service, kept out of the service's own package (issue 14).

    service.py     `searchrl bench` / `make bench`: in-process ceiling vs the HTTP service under load
    index_eval.py  `searchrl index eval`: FAISS index types against Flat (recall, memory, build/load time)
    sizing.py      q/s per core -> replicas and $/1M queries for a trainer of N GPUs (docs/sizing.md)
    start_time.py  `searchrl sky start-time`: replica start from an index bucket stand-in (docs/deploy.md)

They import the retrieval package (never the other way round), so what runs in production is only
`retrieval/`; importing `searchrl.bench` itself loads nothing heavy.
"""
