"""What a run costs in time and money: hours per million environment steps at the measured rate, the time
left (ETA), and with ``--price-per-hour`` dollars per run and per million steps. Pure arithmetic, shared by
``sac-train``'s summary and ``sac-sweep``'s table."""

from __future__ import annotations

from typing import Any

HOUR = 3600.0
MILLION = 1_000_000


def hours_per_million(steps_per_s: float) -> float | None:
    """Hours one million environment steps take at ``steps_per_s`` (None without a rate)."""
    return MILLION / steps_per_s / HOUR if steps_per_s > 0 else None


def eta_s(remaining_steps: int, steps_per_s: float) -> float | None:
    """Seconds until ``remaining_steps`` more are taken at ``steps_per_s`` (None without a rate)."""
    return max(remaining_steps, 0) / steps_per_s if steps_per_s > 0 else None


def dollars(seconds: float | None, price_per_hour: float | None) -> float | None:
    """What ``seconds`` of a machine cost at ``price_per_hour`` (None without either)."""
    if seconds is None or not price_per_hour:
        return None
    return seconds / HOUR * price_per_hour


def cost_fields(steps_per_s: float, run_wall_s: float, price_per_hour: float | None) -> dict[str, Any]:
    """The cost keys of ``sac-train --json``: ``run_wall_s`` is the whole run's time, resumed sessions included."""
    per_million = hours_per_million(steps_per_s)
    return {
        "hours_per_million_steps": _round(per_million, 4),
        "price_per_hour": price_per_hour or None,
        "cost_usd": _round(dollars(run_wall_s, price_per_hour), 4),
        "usd_per_million_steps": _round(dollars(per_million and per_million * HOUR, price_per_hour), 4),
    }


def cost_line(fields: dict[str, Any], peak_rss_mb: float) -> str:
    """The summary's cost sentence, e.g. ``0.92 h per million steps, peak RSS 812 MiB, $0.04 this run ...``."""
    per_million = fields["hours_per_million_steps"]
    parts = [f"{per_million:.2f} h per million steps" if per_million is not None else "no rate measured"]
    parts.append(f"peak RSS {peak_rss_mb:.0f} MiB")
    if fields["cost_usd"] is not None:
        parts.append(f"${fields['cost_usd']:.2f} this run at ${fields['price_per_hour']:g}/h")
    if fields["usd_per_million_steps"] is not None:
        parts.append(f"${fields['usd_per_million_steps']:.2f} per million steps")
    return ", ".join(parts)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
