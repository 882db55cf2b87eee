"""How long a retrieval replica takes to start, per corpus and backend, against the probe's initial delay.

    searchrl sky start-budget --corpus wiki18 --backend dense --delay 3600    # sky/retrieval.yaml's setup runs it

Why: SkyServe starts probing a replica while its setup still runs (setup is detached), and
`initial_delay_seconds` counts from the first failed probe. Setup (install, download, index build) plus the index
load must fit inside it, or the replica ends FAILED_INITIAL_DELAY, which SkyServe treats as unrecoverable: the
service stops launching replicas. The estimates below are seconds from setup start to the first 200 on
/retrieve; docs/deploy.md section 6 gives the measurements, the assumptions and the arithmetic. Setup checks them
first, so a corpus that cannot make it fails at once with the reason in its log, not an hour later.
"""

from __future__ import annotations

from searchrl.errors import DeployError

INSTALL_S = 300.0  # uv: CPU torch + the retrieval extra (~1 GB of wheels); NOT measured here (no cloud)
# AWS gp3 baseline throughput, the slowest default disk: downloads and copies are disk-bound
DISK_MB_S = 125.0
_BUNDLED_DENSE_BUILD_S = 10_033 / 10.9  # MiniLM at 10.9 passages/s on 2 busy cores (42/s idle)
# wiki18 setup I/O in MB: write the 78.5 GB download, read + write the 64.5 GB index parts to join them, write the
# 14 GB gunzipped corpus (gzip itself runs at 128 MB/s here, no faster than the disk)
_WIKI18_FETCH_S = (78_500 + 2 * 64_500 + 14_000) / DISK_MB_S
_WIKI18_BM25_BUILD_S = 21_015_324 / 16_700  # bm25s at 16.7k passages/s (bundled: 10,033 in 0.6 s)
START_ESTIMATES_S: dict[tuple[str, str], tuple[float, str]] = {
    ("bundled", "bm25"): (INSTALL_S + 1.2 + 1.2, "install + build 1.2 s + first 200 1.2 s"),
    ("bundled", "dense"): (
        INSTALL_S + _BUNDLED_DENSE_BUILD_S + 13.5,
        "install + MiniLM build 920 s on 2 busy cores + first 200 13.5 s",
    ),
    ("wiki18-100k", "dense"): (INSTALL_S + 30 + 30, "install + 0.8 GB download + E5 load and first 200"),
    ("wiki18-100k", "bm25"): (INSTALL_S + 10 + 10, "install + download + build 100k passages"),
    ("wiki18", "dense"): (
        INSTALL_S + _WIKI18_FETCH_S + 14_000 / DISK_MB_S + 64_500 / DISK_MB_S + 30,
        "install + download/join/gunzip 221.5 GB of disk I/O + corpus offsets + first Flat query reads 64.5 GB",
    ),
    ("wiki18", "bm25"): (
        INSTALL_S + (14_000 + 14_000) / DISK_MB_S + _WIKI18_BM25_BUILD_S + 60,
        "install + 14 GB download and gunzip + bm25 build over 21M passages",
    ),
}
for _corpus in ("bundled", "wiki18-100k", "wiki18"):  # hybrid builds both indexes
    _d, _b = START_ESTIMATES_S[(_corpus, "dense")], START_ESTIMATES_S[(_corpus, "bm25")]
    START_ESTIMATES_S[(_corpus, "hybrid")] = (_d[0] + _b[0] - INSTALL_S, "dense + bm25 builds")
for _web in ("google", "serper"):
    for _corpus in ("bundled", "wiki18-100k", "wiki18"):
        START_ESTIMATES_S[(_corpus, _web)] = (INSTALL_S + 5.0, "install; nothing to build")


def start_budget(corpus: str, backend: str, delay_s: float, *, margin: float = 1.2) -> str:
    """One line on whether a replica of `corpus`/`backend` starts within the probe's initial delay.

    Raises DeployError (before the long part of setup runs) when the estimate times `margin` exceeds `delay_s`,
    so the replica fails with this line in its log instead of going FAILED_INITIAL_DELAY an hour later.
    """
    estimate = START_ESTIMATES_S.get((corpus, backend))
    if estimate is None:
        return (
            f"replica start: no estimate for corpus {corpus!r} with backend {backend!r}; setup + index load must "
            f"finish within initial_delay_seconds={delay_s:.0f}s (docs/deploy.md)"
        )
    seconds, how = estimate
    if seconds * margin > delay_s:
        raise DeployError(
            f"corpus {corpus} with backend {backend} needs ~{seconds:.0f}s to start ({how}) but "
            f"initial_delay_seconds is {delay_s:.0f}s: raise service.readiness_probe.initial_delay_seconds and "
            f"SEARCHRL_PROBE_DELAY_S to at least {seconds * margin:.0f} in sky/retrieval.yaml, or the replica "
            "ends FAILED_INITIAL_DELAY"
        )
    return (
        f"replica start: corpus {corpus} with backend {backend} needs ~{seconds:.0f}s ({how}); "
        f"the readiness probe allows {delay_s:.0f}s"
    )


__all__ = ["DISK_MB_S", "INSTALL_S", "START_ESTIMATES_S", "start_budget"]
