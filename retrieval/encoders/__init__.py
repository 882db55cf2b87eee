"""The encoders room: text -> vectors with torch or ONNX Runtime, and the measurements that pick how.

    encoder.py    `Encoder`: E5, BGE and sentence-transformers folders through transformers (query and passage side)
    export.py     the query encoder exported to ONNX Runtime (fp32, dynamic int8), cached beside the index
    pool.py       several query-encoder workers behind the one batcher, each pinned to its own cores
    tuning.py     the serving encoder's backend, precision, workers and batch, measured at start-up
    precision.py  the precision an index build encodes passages in (bf16 only where it measures faster)

Imported by the index builds (index/), the dense backend (backends/dense.py) and the benchmarks. It imports only the
shared modules at retrieval/'s top (settings, corpus, queries), never index/, serving/, api/, backends/ or client/
(tests/retrieval/test_rooms.py).
"""
