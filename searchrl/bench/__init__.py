"""Benchmarks of the retrieval service, kept out of the service's own package (issue 14).

    service.py     `searchrl bench` / `make bench`: in-process ceiling vs the HTTP service under load, from
                   service_load.py (one scenario through loadgen.py), service_inprocess.py (the in-process
                   measures) and service_report.py (the printed table)
    reliability.py `searchrl reliability`: the service under faults, from replicas.py (the `searchrl serve`
                   processes), reliability_load.py (checked concurrent calls), connections.py (big body,
                   slow clients) and hostile_load.py (hostile pages, issue 26)
    procfs.py      what the benches read from /proc about a server: RSS, its peak, CPU seconds, smaps
    index_eval.py  `searchrl index eval`: FAISS index types against Flat (recall, memory, build/load time)
    sizing.py      q/s per core -> replicas and $/1M queries for a trainer of N GPUs (docs/sizing.md)
    start_time.py  `searchrl sky start-time`: replica start from an index bucket stand-in (docs/deploy.md)

They import the retrieval package (never the other way round), so what runs in production is only
`retrieval/`; importing `searchrl.bench` itself loads nothing heavy.
"""
