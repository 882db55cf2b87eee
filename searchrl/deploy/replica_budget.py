"""How long a retrieval replica takes to start, per corpus and backend, against the probe's initial delay.

    searchrl sky start-budget --corpus wiki18 --backend dense --delay 2000 --index-bucket my-index   # in setup

Why: SkyServe starts probing a replica while its setup still runs (setup is detached), and
`initial_delay_seconds` counts from the first failed probe. Setup (install, download or copy, index build) plus the
index load must fit inside it, or the replica ends FAILED_INITIAL_DELAY, which SkyServe treats as unrecoverable:
the service stops launching replicas. Setup checks first, so a corpus that cannot make it fails at once with the
reason in its log.

Two paths (docs/deploy.md section 6 gives the measurements, the assumptions and the arithmetic):
- fresh (no SEARCHRL_INDEX_BUCKET): download from the Hub and/or build the index on the replica, as before;
- prebuilt (SEARCHRL_INDEX_BUCKET set, the recommended one): `searchrl index copy` reads the index and corpus
  from the read-only bucket mount onto local disk, bound by the replica's disk (DISK_MB_S), then the service loads.
`install="image"` (an image_id that already has searchrl, docker/retrieval.Dockerfile) drops the pip install.
"""

from __future__ import annotations

from typing import Literal

from searchrl.errors import DeployError

Install = Literal["pip", "image"]

INSTALL_S = 300.0  # uv: CPU torch + the retrieval extra (~1 GB of wheels); NOT measured here (no cloud)
# AWS gp3 baseline throughput, the slowest default disk: downloads and copies are disk-bound
DISK_MB_S = 125.0
_BUNDLED_DENSE_BUILD_S = 10_033 / 10.9  # MiniLM at 10.9 passages/s on 2 busy cores (42/s idle)
# wiki18 setup I/O in MB: write the 78.5 GB download, read + write the 64.5 GB index parts to join them, write the
# 14 GB gunzipped corpus (gzip itself runs at 128 MB/s here, no faster than the disk)
_WIKI18_FETCH_S = (78_500 + 2 * 64_500 + 14_000) / DISK_MB_S
_WIKI18_BM25_BUILD_S = 21_015_324 / 16_700  # bm25s at 16.7k passages/s (bundled: 10,033 in 0.6 s)
_FIRST_FLAT_FROM_DISK_S = 64_500 / DISK_MB_S  # a Flat query reads the whole 64.5 GB index once
# `searchrl serve` of a dense index to the first 200 on a fresh replica: MiniLM measured 29.5-48.8 s here (2 busy
# cores; ~10 s imports + ~35 s of issue 14's start-up ONNX export, quality gate and auto-tune, cached on the
# replica's disk afterwards). E5-base: model load 30 s + that tuning x 4.8 (109.5M vs 22.7M parameters) ~ 170 s:
# NOT measured (no Hub here).
_MINILM_SERVE_S = 49.0
_E5_SERVE_S = 30.0 + 35.0 * 4.8
START_ESTIMATES_S: dict[tuple[str, str], tuple[float, str]] = {
    ("bundled", "bm25"): (INSTALL_S + 1.2 + 1.5, "install + build 1.2 s + first 200 1.5 s"),
    ("bundled", "dense"): (
        INSTALL_S + _BUNDLED_DENSE_BUILD_S + _MINILM_SERVE_S,
        "install + MiniLM build 920 s on 2 busy cores + first 200 49 s",
    ),
    ("wiki18-100k", "dense"): (
        INSTALL_S + 30 + _E5_SERVE_S,
        "install + 0.8 GB download + E5 load, start-up tuning and first 200",
    ),
    ("wiki18-100k", "bm25"): (INSTALL_S + 10 + 10, "install + download + build 100k passages"),
    ("wiki18", "dense"): (
        INSTALL_S + _WIKI18_FETCH_S + 14_000 / DISK_MB_S + _FIRST_FLAT_FROM_DISK_S + _E5_SERVE_S,
        "install + download/join/gunzip 221.5 GB of disk I/O + corpus offsets + first Flat query reads 64.5 GB",
    ),
    ("wiki18", "bm25"): (
        INSTALL_S + (14_000 + 14_000) / DISK_MB_S + _WIKI18_BM25_BUILD_S + 60,
        "install + 14 GB download and gunzip + bm25 build over 21M passages",
    ),
}

# What a replica copies from the index bucket, in MB: corpus + index + offsets. Bundled and the 100k shape are
# measured by `searchrl sky start-time` (bm25 bundled 9.5 MB; a 100k x 768 Flat 307.2 MB + 0.8 MB offsets);
# wiki18 from the published sizes (14 GB corpus, 64.5 GB Flat, 168 MB offsets) and bm25 at the bundled index's
# 413 bytes per passage (4.15 MB / 10,033) x 21,015,324 = 8.7 GB.
COPY_MB: dict[tuple[str, str], float] = {
    ("bundled", "bm25"): 9.5,
    ("bundled", "dense"): 5.4 + 15.4 + 0.1,
    ("wiki18-100k", "dense"): 66.6 + 307.2 + 0.8,
    ("wiki18-100k", "bm25"): 66.6 + 41.3,
    ("wiki18", "dense"): 14_000 + 64_500 + 168,
    ("wiki18", "bm25"): 14_000 + 8_700,
}
# Serve launch -> first 200 once the files are local (docs/deploy.md section 6): bundled measured here (bm25
# 1.4-1.5 s, dense above); E5 as above (not measured); wiki18 dense also pays its first Flat query from disk in the
# worst case (pages the copy left in the page cache make it ~10 s at the measured 6.6 GB/s scan rate).
SERVE_S: dict[tuple[str, str], float] = {
    ("bundled", "bm25"): 1.5,
    ("bundled", "dense"): _MINILM_SERVE_S,
    ("wiki18-100k", "dense"): _E5_SERVE_S + 5.5,  # + the stand-in's cold load and first search, measured
    ("wiki18-100k", "bm25"): 2,
    ("wiki18", "dense"): _E5_SERVE_S + _FIRST_FLAT_FROM_DISK_S,
    ("wiki18", "bm25"): 60,
}
PREBUILT_ESTIMATES_S: dict[tuple[str, str], tuple[float, str]] = {
    key: (
        INSTALL_S + mb / DISK_MB_S + SERVE_S[key],
        f"install + copy {mb / 1000:.2f} GB from the bucket mount at {DISK_MB_S:.0f} MB/s + load to first 200",
    )
    for key, mb in COPY_MB.items()
}
CORPUS_MB = {"bundled": 5.4, "wiki18-100k": 66.6, "wiki18": 14_000}  # in COPY_MB: a hybrid copies it once
for _table in (START_ESTIMATES_S, PREBUILT_ESTIMATES_S):
    for _corpus in ("bundled", "wiki18-100k", "wiki18"):  # hybrid loads both indexes
        _d, _b = _table[(_corpus, "dense")], _table[(_corpus, "bm25")]
        _once = CORPUS_MB[_corpus] / DISK_MB_S if _table is PREBUILT_ESTIMATES_S else 0.0
        _table[(_corpus, "hybrid")] = (_d[0] + _b[0] - INSTALL_S - _once, "dense + bm25")
    for _web in ("google", "serper"):
        for _corpus in ("bundled", "wiki18-100k", "wiki18"):
            _table[(_corpus, _web)] = (INSTALL_S + 5.0, "install; nothing to build")


def estimate(
    corpus: str, backend: str, *, prebuilt: bool = False, install: Install = "pip"
) -> tuple[float, str] | None:
    """(seconds from setup start to the first 200, how) for a corpus/backend, or None when unknown."""
    table = PREBUILT_ESTIMATES_S if prebuilt else START_ESTIMATES_S
    found = table.get((corpus, backend))
    if found is None:
        return None
    seconds, how = found
    if install == "image":  # the image pull happens while provisioning, before SkyServe probes
        seconds, how = seconds - INSTALL_S, how.replace("install", "image (no install)", 1)
    return seconds, how


def start_budget(
    corpus: str,
    backend: str,
    delay_s: float,
    *,
    margin: float = 1.2,
    prebuilt: bool = False,
    install: Install = "pip",
) -> str:
    """One line on whether a replica of `corpus`/`backend` starts within the probe's initial delay.

    Raises DeployError (before the long part of setup runs) when the estimate times `margin` exceeds `delay_s`,
    so the replica fails with this line in its log instead of going FAILED_INITIAL_DELAY later. Without an index
    bucket the line also says what the bucket path would take, when that fits.
    """
    path = "from the index bucket" if prebuilt else "downloading/building on the replica"
    found = estimate(corpus, backend, prebuilt=prebuilt, install=install)
    if found is None:
        return (
            f"replica start: no estimate for corpus {corpus!r} with backend {backend!r}; setup + index load must "
            f"finish within initial_delay_seconds={delay_s:.0f}s (docs/deploy.md)"
        )
    seconds, how = found
    if seconds * margin > delay_s:
        bucket = estimate(corpus, backend, prebuilt=True, install=install) if not prebuilt else None
        hint = ""
        if bucket is not None and bucket[0] * margin <= delay_s:
            hint = (
                f"; from an index bucket it needs ~{bucket[0]:.0f}s, which fits: build it once with "
                "sky/index-build.yaml and launch with `searchrl sky serve --env SEARCHRL_INDEX_BUCKET=...`"
            )
        raise DeployError(
            f"corpus {corpus} with backend {backend} needs ~{seconds:.0f}s to start {path} ({how}) but "
            f"initial_delay_seconds is {delay_s:.0f}s: raise service.readiness_probe.initial_delay_seconds and "
            f"SEARCHRL_PROBE_DELAY_S to at least {seconds * margin:.0f} in sky/retrieval.yaml, or the replica "
            f"ends FAILED_INITIAL_DELAY{hint}"
        )
    return (
        f"replica start: corpus {corpus} with backend {backend} needs ~{seconds:.0f}s {path} ({how}); "
        f"the readiness probe allows {delay_s:.0f}s"
    )


__all__ = [
    "COPY_MB",
    "CORPUS_MB",
    "DISK_MB_S",
    "INSTALL_S",
    "PREBUILT_ESTIMATES_S",
    "SERVE_S",
    "START_ESTIMATES_S",
    "estimate",
    "start_budget",
]
