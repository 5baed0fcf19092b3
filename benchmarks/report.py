"""results.json, results.md (the README's table), throughput.png and latency.png."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import pathlib
import platform
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from benchmarks.core import SystemSpec
from benchmarks.database import Database

__all__ = ["machine_info", "markdown", "write_results"]

SYSTEM_ORDER = ["raw", "pgbench", "sa-sync", "sa-async", "pgqueuer", "procrastinate"]
METRIC_ORDER = [
    "throughput",
    "throughput_fresh",
    "after_vs_fresh",
    "throughput_unnest",
    "throughput_executemany",
    "unit_of_work",
    "unit_of_work_job",
    "job_overhead",
    "p50",
    "p95",
    "p99",
    "rss_start",
    "rss_end",
    "rss_max",
]
WORKLOAD_TITLES = {
    "W1": "W1 enqueue, 1 per transaction",
    "W2": "W2 enqueue, 16 producers",
    "W3": "W3 bulk enqueue, 1,000 per batch",
    "W4": "W4 process, 1 worker, concurrency 1",
    "W5": "W5 process, concurrency 8",
    "W6": "W6 latency enqueue → handler start, 100/s",
    "W5P": "W5P process, 2 processes x 4 handlers",
    "W4B": "W4 behind a backlog of pending jobs",
    "W5B": "W5 behind a backlog of pending jobs",
    "W7": "W7 claim after 1,000,000 jobs flowed through",
    "W8": "W8 outbox: unit of work → relay → publisher",
    "MEM": "MEM worker memory over many jobs",
}
#: (workload, peer, least ratio of sa-outbox's median to the peer's): the issue's targets.
THROUGHPUT_TARGETS = [
    ("W1", "raw", 0.8),
    ("W1", "pgqueuer", 1.0),
    ("W3", "raw", 0.8),
    ("W4", "raw", 0.8),
    ("W4", "pgqueuer", 1.5),
    ("W4", "procrastinate", 10.0),
    ("W5", "raw", 0.8),
    ("W5", "pgqueuer", 1.5),
    ("W5", "procrastinate", 10.0),
    ("W5P", "raw", 0.8),
    ("W4B", "raw", 0.8),
    ("W5B", "raw", 0.8),
]
LATENCY_TARGETS = [("W6", "p50", 5.0), ("W6", "p99", 20.0)]
#: (workload, its own reference workload, least ratio): the same system against itself.
SELF_TARGETS = [("W4B", "W4", 0.9), ("W5B", "W5", 0.9), ("W5", "W4", 1.0)]
SA_SYSTEMS = ["sa-sync", "sa-async"]
#: W7: claim throughput after the flow, over the same on a fresh table.
W7_TARGET = 0.8
#: W1: what sa_outbox.enqueue(session, …) may add to a one-row ORM transaction, in percent.
W1_OVERHEAD_TARGET = 15.0


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(
    db: Database, systems: Mapping[str, SystemSpec], args: Any, started: float
) -> dict[str, Any]:
    """Where and when the numbers were measured, and with what."""
    import psycopg

    with psycopg.connect(db.conninfo(), autocommit=True) as conn:
        server = conn.execute("SELECT version()").fetchone()
        settings: dict[str, str] = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('synchronous_commit', 'shared_buffers', 'max_connections', 'fsync')"
            ).fetchall()
        )
    libraries = {
        name: version
        for name in (
            "sa-outbox",
            "SQLAlchemy",
            "psycopg",
            "psycopg-binary",
            "procrastinate",
            "pgqueuer",
            "matplotlib",
            "psutil",
        )
        if (version := _version(name)) is not None
    }
    for spec in systems.values():
        libraries.update(spec.versions())
    return {
        "date": dt.datetime.fromtimestamp(started, dt.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "processor": platform.processor() or None,
        "python": platform.python_version(),
        "postgresql": server[0] if server else None,
        "postgresql_settings": settings,
        "database": db.name,
        "libraries": libraries,
        "quick": bool(args.quick),
        "runs": args.runs,
        "workloads": list(args.workloads),
        "systems": list(args.systems),
    }


def _fmt(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:,.1f}"
    return f"{value:,.2f}"


def _ordered(names: Iterable[str], order: Sequence[str]) -> list[str]:
    names = set(names)
    known = [name for name in order if name in names]
    return known + sorted(name for name in names if name not in order)


def markdown(rows: Sequence[Mapping[str, Any]], info: Mapping[str, Any]) -> str:
    """The results as Markdown: machine, table (median and min..max), ratios, setups."""
    systems = _ordered({r["system"] for r in rows}, SYSTEM_ORDER)
    workloads = _ordered({r["workload"] for r in rows}, list(WORKLOAD_TITLES))
    by_key = {(r["workload"], r["system"], r["metric"]): r for r in rows}
    lines = [
        "## Benchmark results",
        "",
        f"{info.get('date')}, {info.get('cpu_count')} CPUs ({info.get('machine')}), "
        f"{info.get('postgresql')}, Python {info.get('python')}; "
        f"synchronous_commit = {info.get('postgresql_settings', {}).get('synchronous_commit')}. "
        f"{info.get('runs')} run(s) each{' (quick mode)' if info.get('quick') else ''}, "
        "no-op jobs, the same N for every system. Cells: median (min..max).",
        "",
        "Libraries: "
        + ", ".join(f"{k} {v}" for k, v in info.get("libraries", {}).items() if k != "pgbench")
        + ".",
        "",
        "Indicative only: on a shared machine, only ratios measured side by side in one run "
        "mean anything.",
        "",
        "| workload | metric | " + " | ".join(systems) + " |",
        "|---|---|" + "---|" * len(systems),
    ]
    for workload in workloads:
        metrics = _ordered({r["metric"] for r in rows if r["workload"] == workload}, METRIC_ORDER)
        for metric in metrics:
            unit = next(
                r["unit"] for r in rows if r["workload"] == workload and r["metric"] == metric
            )
            cells = []
            for system in systems:
                row = by_key.get((workload, system, metric))
                if row is None:
                    cells.append("")
                elif row["min"] == row["max"]:
                    cells.append(_fmt(row["median"]))
                else:
                    cells.append(f"{_fmt(row['median'])} ({_fmt(row['min'])}..{_fmt(row['max'])})")
            title = WORKLOAD_TITLES.get(workload, workload)
            lines.append(f"| {title} | {metric} ({unit}) | " + " | ".join(cells) + " |")

    ratio_lines = _ratios(by_key)
    if ratio_lines:
        lines += ["", "### Ratios (medians, same run) and the issue's targets", ""]
        lines += ratio_lines

    lines += ["", "### Setups", ""]
    seen: set[tuple[str, str]] = set()
    for row in sorted(
        rows,
        key=lambda r: (
            workloads.index(r["workload"]),
            systems.index(r["system"]) if r["system"] in systems else 99,
        ),
    ):
        key = (row["workload"], row["system"])
        if key in seen:
            continue
        seen.add(key)
        lines.append(f"- **{row['workload']} {row['system']}**: {row['setup']}")
    return "\n".join(lines) + "\n"


def _ratios(by_key: Mapping[tuple[str, str, str], Mapping[str, Any]]) -> list[str]:
    lines = ["| workload | sa-outbox | versus | ratio | target |", "|---|---|---|---|---|"]
    targets = {(w, peer): least for w, peer, least in THROUGHPUT_TARGETS}
    found = False
    for workload in ("W1", "W3", "W4", "W5", "W5P", "W4B", "W5B"):
        for sa in SA_SYSTEMS:
            mine = by_key.get((workload, sa, "throughput"))
            if mine is None:
                continue
            for peer in ("raw", "pgbench", "pgqueuer", "procrastinate"):
                # W5P against the peers' W5: the same jobs at the same concurrency.
                theirs = by_key.get(("W5" if workload == "W5P" else workload, peer, "throughput"))
                if theirs is None or not theirs["median"]:
                    continue
                ratio = mine["median"] / theirs["median"]
                least = targets.get((workload, peer))
                target = (
                    ""
                    if least is None
                    else f"≥ {least:g}x " + ("(met)" if ratio >= least else "(**not met**)")
                )
                versus = "raw COPY" if (workload, peer) == ("W3", "raw") else peer
                lines.append(f"| {workload} | {sa} | {versus} | {ratio:.2f}x | {target} |")
                found = True
    for workload, reference, least in SELF_TARGETS:
        for sa in SA_SYSTEMS:
            mine = by_key.get((workload, sa, "throughput"))
            own = by_key.get((reference, sa, "throughput"))
            if mine is None or own is None or not own["median"]:
                continue
            ratio = mine["median"] / own["median"]
            verdict = "(met)" if ratio >= least else "(**not met**)"
            lines.append(
                f"| {workload} | {sa} | its own {reference} | {ratio:.2f}x |"
                f" ≥ {least:g}x {verdict} |"
            )
            found = True
    for sa in SA_SYSTEMS:
        overhead = by_key.get(("W1", sa, "job_overhead"))
        if overhead is not None:
            verdict = "(met)" if overhead["median"] <= W1_OVERHEAD_TARGET else "(**not met**)"
            lines.append(
                f"| W1 | {sa} enqueue in a Session | the same ORM transaction without it | "
                f"+{_fmt(overhead['median'])} % | ≤ +{W1_OVERHEAD_TARGET:g} % {verdict} |"
            )
            found = True
    for sa in SA_SYSTEMS:
        kept = by_key.get(("W7", sa, "after_vs_fresh"))
        if kept is not None:
            verdict = "(met)" if kept["median"] >= W7_TARGET else "(**not met**)"
            lines.append(
                f"| W7 | {sa} | its own fresh table | {kept['median']:.2f}x | "
                f"≥ {W7_TARGET:g}x {verdict} |"
            )
            found = True
    for workload, metric, most in LATENCY_TARGETS:
        for sa in SA_SYSTEMS:
            mine = by_key.get((workload, sa, metric))
            if mine is None:
                continue
            verdict = "(met)" if mine["median"] <= most else "(**not met**)"
            lines.append(
                f"| {workload} | {sa} | {metric} latency | {_fmt(mine['median'])} ms | "
                f"≤ {most:g} ms {verdict} |"
            )
            found = True
    return lines if found else []


def _charts(out: pathlib.Path, rows: Sequence[Mapping[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = _ordered({r["system"] for r in rows}, SYSTEM_ORDER)
    palette = SYSTEM_ORDER + [name for name in systems if name not in SYSTEM_ORDER]
    colours = {name: f"C{i}" for i, name in enumerate(palette)}

    def grouped(ax: Any, groups: list[str], pick: Any, ylabel: str, log: bool) -> None:
        present = [s for s in systems if any(pick(g, s) is not None for g in groups)]
        width = 0.8 / max(1, len(present))
        for i, system in enumerate(present):
            xs, ys, lo, hi = [], [], [], []
            for j, group in enumerate(groups):
                row = pick(group, system)
                if row is None:
                    continue
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(row["median"])
                lo.append(row["median"] - row["min"])
                hi.append(row["max"] - row["median"])
            ax.bar(xs, ys, width, yerr=[lo, hi], label=system, color=colours[system], capsize=2)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, fontsize=8)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)

    by_key = {(r["workload"], r["system"], r["metric"]): r for r in rows}
    throughput_workloads = _ordered(
        {r["workload"] for r in rows if r["metric"] == "throughput" and r["workload"] != "MEM"},
        list(WORKLOAD_TITLES),
    )
    fig, ax = plt.subplots(figsize=(9, 4.5))
    if throughput_workloads:
        grouped(
            ax,
            throughput_workloads,
            lambda w, s: by_key.get((w, s, "throughput")),
            "jobs/s (W8: events/s), log scale",
            True,
        )
    ax.set_title("Throughput by workload and system (median, min..max)")
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=90)
    plt.close(fig)

    latency_workloads = [w for w in ("W6", "W8") if any(r["workload"] == w for r in rows)]
    fig, axes = plt.subplots(1, max(1, len(latency_workloads)), figsize=(9, 4), squeeze=False)
    for ax, workload in zip(axes[0], latency_workloads, strict=False):
        grouped(
            ax,
            ["p50", "p95", "p99"],
            lambda p, s, w=workload: by_key.get((w, s, p)),
            "ms",
            False,
        )
        ax.set_title(WORKLOAD_TITLES[workload], fontsize=9)
    fig.suptitle("Latency percentiles (median of runs, min..max)")
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=90)
    plt.close(fig)


def write_results(
    out: pathlib.Path, rows: Sequence[Mapping[str, Any]], info: Mapping[str, Any]
) -> str:
    """Write results.json, results.md and both charts into ``out``; return the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(
        json.dumps({"machine": info, "rows": list(rows)}, indent=1, ensure_ascii=False) + "\n",
        encoding="utf-8",
    )
    table = markdown(rows, info)
    (out / "results.md").write_text(table, encoding="utf-8")
    _charts(out, rows)
    return table
