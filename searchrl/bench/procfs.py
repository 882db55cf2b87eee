"""What the benches read about a server process from Linux /proc: RSS and its peak, CPU seconds, and RSS split
into anonymous and file-backed pages (the mmap'd index among them)."""

from __future__ import annotations

import os
from pathlib import Path


def vm_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak RSS) of process `pid`, in bytes, from /proc/PID/status."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024  # "12345 kB"
    return out


def reset_peak_rss(pid: int) -> bool:
    """Set VmHWM back to the current RSS (write 5 to /proc/PID/clear_refs, Linux 4.0+), so that the peak read
    afterwards is the load's, not start-up's. False where the kernel refuses; then VmHWM is not used."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5", encoding="ascii")
    except OSError:
        return False
    return True


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process, all its threads (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (stat(5))


def process_memory(pid: int, mapped: tuple[Path, ...] = ()) -> dict[str, float] | None:
    """RSS of a process in MB, split into anonymous and file-backed pages (Linux /proc; None elsewhere).

    `mapped_mb`: the resident pages of the given files (the mmap'd FAISS index, corpus, offsets), summed over
    their mappings in /proc/PID/smaps. Those are page cache the kernel can drop and share between processes;
    growth in `anon_mb` is the process's own memory (issue 24 item 4).
    """
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        smaps = Path(f"/proc/{pid}/smaps").read_text() if mapped else ""
    except OSError:
        return None
    fields: dict[str, int] = {}
    for line in rollup.splitlines()[1:]:
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[key] = int(value.split()[0])
    wanted = {str(p.resolve()) for p in mapped}
    mapped_kb = 0
    current = ""
    for line in smaps.splitlines():
        head = line.split(maxsplit=5)
        if head and "-" in head[0] and not head[0].endswith(":"):  # a mapping's header line
            current = head[5].strip() if len(head) > 5 else ""
        elif line.startswith("Rss:") and current in wanted:
            mapped_kb += int(line.split()[1])
    rss, anon = fields.get("Rss", 0), fields.get("Anonymous", 0)
    return {
        "rss_mb": rss / 1024,
        "anon_mb": anon / 1024,
        "file_mb": (rss - anon) / 1024,
        "mapped_mb": mapped_kb / 1024,
    }


__all__ = ["process_cpu_seconds", "process_memory", "reset_peak_rss", "vm_status"]
