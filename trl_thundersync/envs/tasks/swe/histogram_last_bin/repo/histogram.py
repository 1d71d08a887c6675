"""Fixed-width histograms for the latency dashboard."""

from __future__ import annotations


def bin_edges(low: float, high: float, bins: int) -> list[float]:
    if bins < 1 or high <= low:
        raise ValueError("need bins >= 1 and high > low")
    width = (high - low) / bins
    return [low + i * width for i in range(bins + 1)]


def histogram(values: list[float], low: float, high: float, bins: int) -> list[int]:
    """Counts per bin. Bins are [edge_i, edge_i+1); the last bin also includes `high`. Values outside are ignored."""
    edges = bin_edges(low, high, bins)
    width = edges[1] - edges[0]
    counts = [0] * bins
    for value in values:
        if value < low or value >= high:
            continue
        counts[int((value - low) // width)] += 1
    return counts
