"""The figures every bench prints: nearest-rank percentiles and a one-line summary."""

import statistics


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]


def summary(name: str, values: list[float], unit: str = "s") -> str:
    return (
        f"{name:<28} n={len(values):<3} median {statistics.median(values):6.3f} {unit}   "
        f"p95 {percentile(values, 0.95):6.3f} {unit}   min {min(values):6.3f} {unit}   "
        f"max {max(values):6.3f} {unit}"
    )
