"""The retrieval service, its index and its client, in rooms by who imports what (tests/retrieval/test_rooms.py).

    client/    what calls a running service: all the trainer and infer load (no faiss, torch or numpy)
    encoders/  text -> vectors (torch, ONNX Runtime) and the measurements that pick how
    index/     corpora and index directories: build, download, convert, copy, recall
    backends/  the search behind /retrieve: dense, bm25, hybrid, web (one per file)
    serving/   the service `searchrl serve` runs: app, server, hot path, batcher, cache, metrics
    api/       the app's parts (middleware, probes, handlers), assembled by serving/app.py

At the top only what several rooms share: settings.py (RetrievalSettings), schemas.py (the /retrieve wire format),
corpus.py (Search-R1 JSONL and the document store), queries.py (realistic queries for gates and benchmarks),
heap.py (freed heap back to the OS) and process.py (`searchrl serve` as a child process). docs/retrieval.md "The
pieces" maps every module.
"""
