"""Issue 18's targets, computed from one report of ``compare.py``.

Every ratio is taken between figures of the same run, and every verdict follows from
them: none is written by hand. A target whose figures the run does not have (a quick run,
a system left out, a failed workload) is "not measured", with what is missing.
"""

from __future__ import annotations

import math
from typing import Any

PEERS = ("celery", "rq", "huey", "dramatiq")
SQLITE = "delayjobs"
POSTGRES = "delayjobs (PostgreSQL)"

W3_VS_FASTEST_PEER = 1.2
W2_MAX_MS = 10.0
W1_VS_CELERY = 1.2
BATCH_VS_HUEY = 1.0
BYTES_PER_PENDING = 60.0
AT_PENDING = 1_000_000
FLAT_FROM = 1_000
FLAT_WITHIN = 0.2


def get(systems: dict[str, Any], *path: str) -> Any:
    """``systems[a][b]...``, or None where a step is missing."""
    value: Any = systems
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def at_most(value: float, bound: float) -> bool:
    """``value <= bound``, counting a value that is the bound but for a float's rounding
    (5.4 / 4.5 is 1.2000000000000002) as at it."""
    return value <= bound or math.isclose(value, bound)


def row(target: str, measured: str, ok: bool | None, why: str = "") -> dict[str, str]:
    verdict = "not measured" if ok is None else "met" if ok else "missed"
    return {
        "target": target,
        "measured": measured,
        "verdict": verdict + (f": {why}" if why else ""),
    }


def behind(d: dict[str, Any]) -> dict[str, str] | None:
    """A row whose jobs were still being scheduled when they fell due measures the harness,
    not the system: no verdict on it."""
    return None if "harness_note" not in d else {"verdict": f"not measured: {d['harness_note']}"}


def faults(d: dict[str, Any]) -> str:
    """What went wrong with the jobs of one workload ("" when every job ran once, on time)."""
    counts = [(d.get(k) or 0, k) for k in ("missing", "duplicated", "early")]
    return ", ".join(f"{n:,} {k}" for n, k in counts if n)


def w3(systems: dict[str, Any], name: str, where: str) -> dict[str, str]:
    target = f"W3 drain >= {W3_VS_FASTEST_PEER}x the fastest peer, {where}"
    ours = get(systems, name, "W3", "jobs_per_s")
    absent = [p for p in (name, *PEERS) if p not in systems]
    peers = {p: v for p in PEERS if (v := get(systems, p, "W3", "jobs_per_s"))}
    if absent:
        return row(target, "-", None, f"not in this run: {', '.join(absent)}")
    if ours is None or not peers:
        return row(target, "-", None, f"no W3 figure for {name if ours is None else 'any peer'}")
    fastest = max(peers, key=lambda p: peers[p])
    ratio = ours / peers[fastest]
    measured = f"{ours:,.0f} jobs/s against {fastest} {peers[fastest]:,.0f}: **{ratio:.2f}x**"
    failed = [p for p in PEERS if p not in peers]
    if failed:
        measured += f" (no W3 figure for {', '.join(failed)})"
    late = [p for p in peers if "harness_note" in systems[p]["W3"]]
    if late:
        measured += f" (scheduling ended after the due time for {', '.join(late)})"
    bad = faults(systems[name]["W3"])
    verdict = row(target, measured, at_most(W3_VS_FASTEST_PEER, ratio) and not bad, bad)
    return verdict | (behind(systems[name]["W3"]) or {})


def w2(systems: dict[str, Any], name: str, where: str) -> dict[str, str]:
    target = f"W2 lateness p99 <= Celery's p99, and max <= {W2_MAX_MS:.0f} ms, {where}"
    ours, celery = get(systems, name, "W2"), get(systems, "celery", "W2")
    if not ours or "p99_ms" not in ours or not celery or "p99_ms" not in celery:
        missing = name if not ours or "p99_ms" not in ours else "celery"
        return row(target, "-", None, f"no W2 p99 for {missing}")
    ratio = f": **{ours['p99_ms'] / celery['p99_ms']:.2f}x**" if celery["p99_ms"] else ""
    measured = (
        f"p99 {ours['p99_ms']:.1f} ms against Celery {celery['p99_ms']:.1f} ms{ratio}; "
        f"max {ours['max_ms']:.1f} ms"
    )
    bad = faults(ours)
    if "harness_note" in celery:
        measured += f" (Celery: {celery['harness_note']})"
    ok = ours["p99_ms"] <= celery["p99_ms"] and ours["max_ms"] <= W2_MAX_MS and not bad
    return row(target, measured, ok, bad) | (behind(ours) or {})


def w1_ratio(systems: dict[str, Any], name: str, api: str, peer: str) -> tuple[str, float | None]:
    ours = get(systems, name, "W1", api, "jobs_per_s")
    theirs = get(systems, peer, "W1", "one at a time", "jobs_per_s")
    if ours is None or not theirs:  # a peer's rate of 0: nothing to compare with
        return "-", None
    ratio = ours / theirs
    return f"{ours:,.0f} jobs/s against {peer} {theirs:,.0f}: **{ratio:.2f}x**", ratio


def w1(systems: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for api, peer, wanted, what, theirs in (
        ("one at a time", "celery", W1_VS_CELERY, "`schedule()` one at a time",
         f"{W1_VS_CELERY}x Celery's `apply_async`"),
        ("batch API", "huey", BATCH_VS_HUEY, "`schedule_many`", "Huey's one at a time"),
    ):  # fmt: skip
        target = f"W1 {what} >= {theirs}, with the row and its history on SQLite"
        measured, ratio = w1_ratio(systems, SQLITE, api, peer)
        why = "" if ratio is not None else f"no W1 figure for {SQLITE} or {peer}"
        rows.append(row(target, measured, None if ratio is None else at_most(wanted, ratio), why))
    return rows


def w4_sizes(systems: dict[str, Any]) -> dict[int, dict[str, Any]]:
    w4 = get(systems, SQLITE, "W4") or {}
    return {int(m): d for m, d in w4.items() if m.isdigit() and isinstance(d, dict)}


def memory(systems: dict[str, Any]) -> dict[str, str]:
    target = f"Redis <= {BYTES_PER_PENDING:.0f} B per pending job at {AT_PENDING:,} pending"
    sizes = {m: d for m, d in w4_sizes(systems).items() if "redis_bytes_per_pending" in d}
    if not sizes:
        return row(target, "-", None, "no W4 prefill of delayjobs")
    m = max(sizes)
    b = sizes[m]["redis_bytes_per_pending"]
    measured = f"**{b:,.0f} B** per pending job with {m:,} pending (W4 prefill)"
    if m < AT_PENDING:
        return row(target, measured, None, f"the largest backlog was {m:,}")
    return row(target, measured, b <= BYTES_PER_PENDING)


def flat(systems: dict[str, Any]) -> dict[str, str]:
    target = (
        f"W4 flat from {FLAT_FROM:,} to {AT_PENDING:,} pending: schedule rate no more than "
        f"{FLAT_WITHIN:.0%} lower and p99 no more than {FLAT_WITHIN:.0%} higher than at "
        f"{FLAT_FROM:,}"
    )
    sizes = w4_sizes(systems)
    failed = [m for m, d in sizes.items() if "failed" in d]
    done = {m: d for m, d in sorted(sizes.items()) if "p99_ms" in d and "jobs_per_s" in d}
    if FLAT_FROM not in done:
        return row(target, "-", None, f"no W4 figure for {SQLITE} at {FLAT_FROM:,}")
    base, larger = done[FLAT_FROM], [d for m, d in done.items() if m > FLAT_FROM]
    if not larger:
        return row(target, "-", None, f"no W4 figure for {SQLITE} above {FLAT_FROM:,}")
    if not base["jobs_per_s"] or not base["p99_ms"]:
        return row(target, "-", None, f"a zero figure at {FLAT_FROM:,}, nothing to compare with")
    rate = min(d["jobs_per_s"] for d in larger) / base["jobs_per_s"] - 1
    p99 = max(d["p99_ms"] for d in larger) / base["p99_ms"] - 1
    measured = (
        "schedule jobs/s "
        + " / ".join(f"{d['jobs_per_s']:,.0f}" for d in done.values())
        + f" (**{rate:+.0%}** at worst); p99 ms "
        + " / ".join(f"{d['p99_ms']:.1f}" for d in done.values())
        + f" (**{p99:+.0%}** at worst), at "
        + " / ".join(f"{m:,}" for m in done)
    )
    bad = ", ".join(f"{faults(d)} at {m:,}" for m, d in done.items() if faults(d))
    if failed:
        return row(target, measured, False, f"failed at {min(failed):,} pending")
    if late := [f"{m:,}: {d['harness_note']}" for m, d in done.items() if "harness_note" in d]:
        return row(target, measured, None, "; ".join(late))
    if max(done) < AT_PENDING:
        return row(target, measured, None, f"the largest backlog run was {max(done):,}")
    ok = at_most(-rate, FLAT_WITHIN) and at_most(p99, FLAT_WITHIN) and not bad
    return row(target, measured, ok, bad)


def scaling(systems: dict[str, Any]) -> dict[str, str]:
    target = "Scaling: W5 drain on PostgreSQL with --concurrency 1, 2, 4 and 2 processes"
    w5 = {k: d for k, d in (get(systems, POSTGRES, "W5") or {}).items() if isinstance(d, dict)}
    rates = {label: d["jobs_per_s"] for label, d in w5.items() if "jobs_per_s" in d}
    if not rates:
        return row(target, "-", None, f"no W5 figure for {POSTGRES} (needs --also-postgres)")
    one = [
        d["jobs_per_s"]
        for d in w5.values()
        if "jobs_per_s" in d and d.get("threads") == d.get("processes") == 1
    ]
    measured = "; ".join(
        f"{label}: {r:,.0f} jobs/s" + (f" ({r / one[0]:.2f}x)" if one and one[0] else "")
        for label, r in rates.items()
    )
    best = max(rates, key=lambda label: rates[label])
    bad = ", ".join(f"{faults(d)} with {label}" for label, d in w5.items() if faults(d))
    failed = [f"failed: {label}" for label, d in w5.items() if "failed" in d]
    late = [f"{label}: {d['harness_note']}" for label, d in w5.items() if "harness_note" in d]
    notes = [f"highest with {best}", *([bad] if bad else []), *failed, *late]
    return {"target": target, "measured": measured, "verdict": "reported: " + "; ".join(notes)}


def evaluate(report: dict[str, Any]) -> list[dict[str, str]]:
    """Every target of issue 18 with its measured ratio and verdict, from this report."""
    systems = {s["system"]: s for s in report["systems"]}
    return [
        w3(systems, SQLITE, "SQLite"),
        w3(systems, POSTGRES, "PostgreSQL"),
        w2(systems, SQLITE, "SQLite"),
        w2(systems, POSTGRES, "PostgreSQL"),
        *w1(systems),
        memory(systems),
        flat(systems),
        scaling(systems),
    ]


def postgres_w1(report: dict[str, Any]) -> list[str]:
    """The W1 ratios on PostgreSQL: shown beside the targets, which are set on SQLite."""
    systems = {s["system"]: s for s in report["systems"]}
    lines = []
    for api, peer in (("one at a time", "celery"), ("batch API", "huey")):
        measured, ratio = w1_ratio(systems, POSTGRES, api, peer)
        if ratio is not None:
            lines.append(f"W1 {api} on PostgreSQL: {measured}")
    return lines
