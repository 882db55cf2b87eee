"""The table and ratios `searchrl bench` prints from a run's report (searchrl/bench/service.py)."""

from __future__ import annotations

from typing import Any

from searchrl.bench.service import REFERENCE


def format_memory(memory: dict[str, Any]) -> str:
    """(m): the service's RSS after start-up and at the end, anonymous vs file-backed, and the reference's."""

    def one(m: dict[str, float] | None) -> str:
        if not m:
            return "-"
        mapped = f", {m['mapped_mb']:.0f} of it the mmap'd index/corpus/offsets" if "mapped_mb" in m else ""
        return f"{m['rss_mb']:.0f} MB (anon {m['anon_mb']:.0f}, file-backed {m['file_mb']:.0f}{mapped})"

    return (
        f"memory (RSS, /proc/PID/smaps): service after start-up {one(memory.get('service_after_start'))}; "
        f"after every scenario {one(memory.get('service_at_end'))} (the result cache included); "
        f"reference-like server {one(memory.get('reference'))}"
    )


def format_report(report: dict[str, Any]) -> str:
    """The table and ratios, as printed by `searchrl bench`."""
    lines = [*_table(report), ""]
    lines += _setup_lines(report)
    lines += _ratio_lines(report)
    lines.append(
        "load generators (searchrl/bench/loadgen.py, a separate process on the same cores): raw = wrk-like "
        "keep-alive HTTP/1.1 on uvloop + httptools, aiohttp = the client used before; both check status 200 "
        "and one result list per query on every response; CPU ms/req from getrusage (client) and /proc "
        "(server, all threads, encoder included)"
    )
    memory = report.get("memory") or {}
    if memory:
        lines.append(format_memory(memory))
    for name, ok in report["targets"].items():
        lines.append(f"  [{'x' if ok else ' '}] {name}")
    if report.get("sizing"):
        from searchrl.bench.sizing import format_sizing

        lines.append("")
        lines.append("sizing (searchrl/bench/sizing.py; assumptions in docs/sizing.md):")
        lines.append(format_sizing(report["sizing"]))
    lines.append(f"results: {report['path']}")
    return "\n".join(lines)


def _table(report: dict[str, Any]) -> list[str]:
    """One row per measurement: (a) the in-process ceiling, (r) the reference, (b)/(c)/(h), (a') and (e5)."""
    header = (
        f"{'scenario':42} {'q/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'batch':>6} {'cached/dedup':>13}"
        f" {'CPU ms/req client/server':>25} {'RSS MB':>7}"
    )
    lines = [header, "-" * len(header)]
    for row in report["ceiling"]:
        name = f"(a) in-process {row['precision']} {row['threads']}thr fwd {row['forward']} batch {row['batch_size']}"
        lines.append(f"{name:42} {row['qps']:8.0f} {'':>8} {'':>8} {'':>7} {row['batch_size']:6d}")
    for r in [*report.get("reference", []), *report["service"]]:
        looked = r["cache_hits"] + r["cache_misses"]
        hit = f"{100 * r['cache_hits'] / looked:.0f}%/{100 * r['dedup'] / looked:.0f}%" if looked else "-"
        server = r.get("server_cpu_ms_per_request")
        cpu = f"{r.get('client_cpu_ms_per_request', 0):.3f} / {'-' if server is None else f'{server:.3f}'}"
        rss = "-" if r.get("server_rss_mb") is None else f"{r['server_rss_mb']:.0f}"
        lines.append(
            f"{r['name']:42} {r['qps']:8.0f} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f} {r['errors']:7d} "
            f"{r['mean_batch']:6.1f} {hit:>13} {cpu:>25} {rss:>7}"
        )
    for row in report.get("workers_scaling", []):
        name = f"(a') in-process {row['candidate']} {row['workers']} workers x 1thr"
        lines.append(f"{name:42} {row['qps']:8.0f}")
    for row in report.get("e5_shape", []):
        name = f"(e5) encoder only, E5-base shape {row['candidate']}"
        lines.append(f"{name:42} {row['qps']:8.0f}")
    return lines


def _setup_lines(report: dict[str, Any]) -> list[str]:
    """What the numbers were measured with: the ceiling's best, the encoder the service picked, the machine, and
    every encoder candidate's recall and rate."""
    best = report["ceiling_best"]
    enc = report.get("encoder") or {}
    tuning = report.get("encoder_tuning") or {}
    machine = report.get("machine") or {}
    lines = [
        f"ceiling (today's torch fp32, best in-process): {best['qps']:.0f} q/s ({best['threads']} threads, "
        f"forward {best['forward']}, batch {best['batch_size']}); all throughput is on unique queries (no "
        "cache hits) unless a row says otherwise",
        f"service encoder (auto-tuned at start-up): {enc.get('encoder_backend')} {enc.get('precision')}, "
        f"{enc.get('encoder_workers')} workers x {enc.get('threads_per_worker')} threads, forward "
        f"{enc.get('forward_batch_size')}, {tuning.get('qps', 0):.0f} q/s in-process; batch <= "
        f"{report['settings']['SEARCHRL_RETRIEVAL_BATCH_SIZE']}; start-up {report['server_startup_s']:.1f}s "
        f"(tuning {tuning.get('seconds', 0):.1f}s)",
        f"machine: {machine.get('cpu')}, {machine.get('cpus')} cores, fast bf16 {machine.get('fast_bf16')}, "
        f"load average {machine.get('loadavg_1m_before', 0):.2f} before the run",
        f"encoder candidates (recall@3 vs fp32 torch on {tuning.get('gate_queries', 0)} dev+bench queries):",
    ]
    for c in tuning.get("candidates", []):
        recall = "-" if c.get("recall@3") is None else f"{c['recall@3']:.3f}"
        qps = "-" if c.get("qps") is None else f"{c['qps']:.0f} q/s"
        lines.append(f"  {c['name']:10} recall@3 {recall:>6}  {qps:>9}  {c['status']}")
    return lines


def _ratio_lines(report: dict[str, Any]) -> list[str]:
    """The ratios the issues ask for, each with its target; a ratio whose rows or key are missing is left out."""
    ratios = report["ratios"]
    reference = {r["name"]: r for r in report.get("reference", [])}
    service = {r["name"]: r for r in report["service"]}
    lines = []
    r1, b1 = reference.get(REFERENCE[0]), service.get("(b) 1 client x 1 query")
    if r1 and b1:
        lines.append(
            f"(b) 1 client / reference-like 1 client: {ratios['b1_over_reference']:.2f}x q/s, p50 "
            f"{b1['p50_ms']:.1f} vs {r1['p50_ms']:.1f} ms   (target >= 1.0x)"
        )
    r128, b128 = reference.get(REFERENCE[1]), service.get("(b) 128 clients x 1 query")
    if r128 and b128:
        lines.append(
            f"(b) 128 clients / reference-like 128 clients: {ratios['b128_over_reference']:.2f}x q/s, p99 "
            f"{b128['p99_ms']:.0f} vs {r128['p99_ms']:.0f} ms"
        )
    lines.append(f"(b) 128 clients / fp32 ceiling: {ratios['b128_over_ceiling']:.2f}x   (target >= 2x)")
    if "b128_p99_over_queueing_bound" in ratios:
        lines.append(
            f"(b) 128 clients p99 / (128 / q/s): {ratios['b128_p99_over_queueing_bound']:.2f}x   (target <= 1.3x)"
        )
    if ratios.get("b128_over_tuned_encoder"):
        lines.append(
            f"(b) 128 clients / the service's encoder in-process: {ratios['b128_over_tuned_encoder']:.2f}x   "
            "(what HTTP, batching and the event loop leave of the encoder's rate)"
        )
    lines.append(f"(c) 5x repeats per client / (b) 32 clients: {ratios['c_over_b32']:.1f}x   (target >= 3x)")
    lines.append(
        f"(c') 5x repeats sent concurrently / (b) 32 clients: {ratios['c_concurrent_over_b32']:.1f}x   (no target)"
    )
    return lines


__all__ = ["format_memory", "format_report"]
