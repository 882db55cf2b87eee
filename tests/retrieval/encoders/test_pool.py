"""Encoder workers behind one batch call: same vectors as one encoder, each worker on its own cores."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from searchrl.retrieval.encoders.encoder import Encoder
from searchrl.retrieval.encoders.pool import EncoderPool, core_sets, own_tokenizer

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def minilm() -> Encoder:
    return Encoder.load("bundled-minilm", device="cpu", precision="fp32", batch_size=4)


def test_core_sets_are_disjoint_until_cores_run_out() -> None:
    assert core_sets(2, 1, [0, 1]) == [[0], [1]]
    assert core_sets(4, 4, list(range(16))) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert core_sets(3, 1, [5, 7]) == [[5], [7], [5]]  # more workers than cores: wrap round


def test_two_workers_give_the_vectors_of_one(minilm: Encoder) -> None:
    queries = [f"question {i} about {'long ' * (i % 7)}topics" for i in range(23)] + ["x"]
    seen: list[tuple[str, frozenset[int]]] = []

    def factory(i: int) -> Encoder:
        seen.append((threading.current_thread().name, frozenset(os.sched_getaffinity(0))))
        return own_tokenizer(minilm)

    pool = EncoderPool(factory, workers=2, threads=1, name="test")
    try:
        got = pool.encode_queries(queries)
        np.testing.assert_allclose(got, minilm.encode_queries(queries), atol=1e-5)
        assert pool.encode_queries(["only one"]).shape == (1, 384)
        assert pool.describe()["encoder_workers"] == 2 and pool.dim == 384
    finally:
        pool.close()
    names = sorted(name for name, _ in seen)
    assert names == ["test-0_0", "test-1_0"]  # built on each worker's own thread
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:  # pinned: one core each, and different ones
        assert [len(c) for _, c in seen] == [1, 1] and seen[0][1] != seen[1][1]
    assert os.sched_getaffinity(0) == set(cores)  # the caller's own affinity is untouched


def test_one_worker_runs_on_the_callers_thread(minilm: Encoder) -> None:
    pool = EncoderPool(lambda i: minilm, workers=1, threads=2)
    assert pool.first is minilm and pool._executors == []
    np.testing.assert_allclose(pool.encode_queries(["a", "b"]), minilm.encode_queries(["a", "b"]), atol=1e-6)
    pool.batch_size = 8
    assert minilm.batch_size == 8
    with pytest.raises(ValueError, match="at least 1"):
        EncoderPool(lambda i: minilm, workers=0, threads=1)


def test_unpinned_workers_keep_the_process_affinity(minilm: Encoder) -> None:
    seen: list[frozenset[int]] = []

    def factory(i: int) -> Encoder:
        seen.append(frozenset(os.sched_getaffinity(0)))
        return own_tokenizer(minilm)

    pool = EncoderPool(factory, workers=2, threads=1, pin=False)
    pool.close()
    assert not pool.pinned and seen == [frozenset(os.sched_getaffinity(0))] * 2
