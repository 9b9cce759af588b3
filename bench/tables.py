"""The Markdown report of ``compare.py``: one table per workload, the targets of issue 18
(``targets.py``), versions and settings."""

from __future__ import annotations

import json
from typing import Any

import targets

LATE = "| p50 ms | p90 ms | p99 ms | max ms | ran | early | missing | dup |"


def fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def failure(d: dict[str, Any], width: int = 120) -> str:
    return "failed: " + d["failed"].split("; log: ")[0][:width].replace("|", "/").replace("\n", " ")


def late_cells(d: dict[str, Any]) -> list[str]:
    if "skipped" in d:
        return [d["skipped"]] + [""] * 7
    if "failed" in d:
        return [failure(d)] + [""] * 7
    return [fmt(d.get(k), 1) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")] + [
        fmt(d.get(k)) for k in ("ran", "early", "missing", "duplicated")
    ]


def section(title: str, header: str, rows: list[str]) -> list[str]:
    if not rows:
        return []
    columns = header.count("|") - 1
    return ["", title, "", header, "|---" + "|--:" * (columns - 1) + "|", *rows]


def w1_table(systems: list[dict[str, Any]]) -> list[str]:
    rows = []
    for s in systems:
        w = s.get("W1", {})
        if "failed" in w:
            rows.append(f"| {s['system']} | | {failure(w, 160)} | |")
        for api, d in w.items():
            if isinstance(d, dict):
                rows.append(
                    f"| {s['system']} | {api} | {fmt(d['jobs_per_s'])} "
                    f"| {fmt(d['redis_bytes_per_job'])} |"
                )
    return section(
        "W1: schedule N jobs due in 1 h, from one process, no worker running",
        "| system | API | jobs/s | Redis B/job |",
        rows,
    )


def w2_table(systems: list[dict[str, Any]]) -> list[str]:
    rows = [
        f"| {s['system']} | " + " | ".join(late_cells(s["W2"])) + " |" for s in systems if "W2" in s
    ]
    return section("W2: lateness, jobs due uniformly over the span", "| system " + LATE, rows)


def drain_cells(d: dict[str, Any]) -> str:
    if "failed" in d:
        return f"{failure(d, 160)} |||||||"
    return (
        f"{fmt(d.get('jobs_per_s'))} | {fmt(d.get('ran'))} | {fmt(d.get('missing'))} "
        f"| {fmt(d.get('duplicated'))} | {fmt(d.get('p50_ms'), 1)} | {fmt(d.get('p99_ms'), 1)} "
        f"| {fmt(d.get('max_ms'), 1)} |"
    )


def w3_table(systems: list[dict[str, Any]]) -> list[str]:
    rows = [f"| {s['system']} | " + drain_cells(s["W3"]) for s in systems if "W3" in s]
    return section(
        "W3: drain, N jobs due at the same moment (jobs/s from the due time)",
        "| system | jobs/s | ran | missing | dup | p50 ms | p99 ms | max ms |",
        rows,
    )


def w4_table(systems: list[dict[str, Any]]) -> list[str]:
    rows = []
    for s in systems:
        w4 = s.get("W4", {})
        if "failed" in w4:
            rows.append(f"| {s['system']} | | {failure(w4, 160)} |||||||||||")
        for m_pending, d in w4.items():
            if isinstance(d, dict):
                rows.append(
                    f"| {s['system']} | {fmt(int(m_pending))} "
                    f"| {fmt(d.get('prefill_jobs_per_s'))} "
                    f"| {fmt(d.get('redis_bytes_per_pending'))} | {fmt(d.get('jobs_per_s'))} | "
                    + " | ".join(late_cells(d))
                    + " |"
                )
    return section(
        "W4: with M jobs pending 1 day out (prefilled, Redis bytes per pending job), K "
        "near-term jobs scheduled one at a time",
        "| system | M pending | prefill jobs/s | Redis B/pending | schedule jobs/s " + LATE,
        rows,
    )


def w5_table(systems: list[dict[str, Any]]) -> list[str]:
    rows = []
    for s in systems:
        w5 = s.get("W5", {})
        if "failed" in w5:
            rows.append(f"| {s['system']} | | {failure(w5, 160)} |||||||")
        for label, d in w5.items():
            if isinstance(d, dict):
                rows.append(f"| {s['system']} | {label} | " + drain_cells(d))
    return section(
        "W5: drain with more workers (delayjobs only), N jobs due at the same moment "
        "(scheduled with the batch API)",
        "| system | workers | jobs/s | ran | missing | dup | p50 ms | p99 ms | max ms |",
        rows,
    )


def targets_table(report: dict[str, Any]) -> list[str]:
    rows = [
        f"| {t['target']} | {t['measured']} | {t['verdict']} |" for t in targets.evaluate(report)
    ]
    lines = [
        "",
        "Targets of issue 18, computed from the figures above (same run)",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        *rows,
    ]
    if also := targets.postgres_w1(report):
        lines += ["", "Also on PostgreSQL (the W1 targets are set on SQLite):", ""]
        lines += [f"- {line}" for line in also]
    lines += [
        "",
        "Promote throughput and bounded cancel/reschedule are measured by `bench/engine.py`, "
        "not by this run.",
    ]
    if report["quick"]:
        lines += ["", "A quick run: its sizes are too small for the targets."]
    return lines


def versions(systems: list[dict[str, Any]]) -> list[str]:
    lines = ["", "Versions and settings", ""]
    for s in systems:
        names = ", ".join(f"{k} {v}" for k, v in s.get("versions", {}).items())
        settings = "; ".join(f"{k}: {v}" for k, v in s.get("settings", {}).items())
        failed = f" FAILED: {s['failed']}" if "failed" in s else ""
        lines.append(
            f"- **{s['system']}** ({names}; Redis {s.get('redis', '?')}): {settings}" + failed
        )
    return lines


def notes(systems: list[dict[str, Any]]) -> list[str]:
    found = []
    for s in systems:
        for w in ("W2", "W3", "W4", "W5"):
            d = s.get(w) or {}
            nested = w in ("W4", "W5")  # a row per backlog size, per worker setting
            parts = [(f" {label}", v) for label, v in d.items()] if nested else [("", d)]
            found += [
                f"- {s['system']} {w}{label}: {part[k]}"
                for label, part in parts
                if isinstance(part, dict)
                for k in ("harness_note", "note")
                if k in part
            ]
    return ["", "Notes", "", *found] if found else []


def header(report: dict[str, Any]) -> str:
    m = report["machine"]
    end = m.get("load_average_at_end")
    took = report.get("seconds")
    return (
        f"{'Quick run' if report['quick'] else 'Full run'}, {m['date']}, {m['cpus']} CPUs, "
        f"{m['platform']}, Python {m['python']}, load average at start "
        f"{m['load_average_at_start']:.2f}"
        + (f", at end {end:.2f}" if end is not None else "")
        + (f", {took / 60:.0f} min" if took is not None else "")
        + f". Sizes: {json.dumps(report['sizes'])}."
    )


def markdown(report: dict[str, Any]) -> str:
    systems = report["systems"]
    lines = [
        header(report),
        *w1_table(systems),
        *w2_table(systems),
        *w3_table(systems),
        *w4_table(systems),
        *w5_table(systems),
        *targets_table(report),
        *versions(systems),
        *notes(systems),
    ]
    return "\n".join(lines) + "\n"
