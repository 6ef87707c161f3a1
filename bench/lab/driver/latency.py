"""Latencies counted in HDR's buckets with numpy, and the scheduled times parsed in bulk."""

from __future__ import annotations

import numpy as np
from hdrh.histogram import HdrHistogram

from bench.lab.driver.frames import DIGITS
from bench.lab.results import PERCENTILES

#: HDR histogram range and precision, microseconds
HIST_MIN_US, HIST_MAX_US, HIST_DIGITS = 1, 60_000_000, 3


class LatencyHistogram:
    """Latencies in microseconds counted in HDR's buckets (1 us .. 60 s, 3 significant digits).

    Counting is numpy's (``bincount`` over the buckets' indices), so a batch of
    deliveries costs little and never one ``hdrh`` call per value; percentiles are
    read as ``hdrh`` reads them, and :meth:`to_hdr` gives the same histogram as
    recording each value into an ``HdrHistogram``.
    """

    def __init__(self) -> None:
        self.counts = np.zeros(_HDR_COUNTS_LEN, dtype=np.int64)

    def add(self, values_us: np.ndarray) -> None:
        """Count every value (clipped to the histogram's range)."""
        if len(values_us):
            values = np.clip(values_us, 0, HIST_MAX_US)
            self.counts += np.bincount(_hdr_index(values), minlength=_HDR_COUNTS_LEN)

    def merge_into(self, other: LatencyHistogram) -> None:
        """Add these counts to ``other``'s and start from zero again."""
        other.counts += self.counts
        self.counts[:] = 0

    @property
    def count(self) -> int:
        """How many values were added."""
        return int(self.counts.sum())

    def value_at_percentile(self, percentile: float) -> int:
        """The value at ``percentile`` (0 < percentile <= 100), as ``hdrh`` answers; 0 if empty."""
        cumulative = np.cumsum(self.counts)
        total = int(cumulative[-1])
        if not total:
            return 0
        target = max(int(min(percentile, 100.0) * total / 100 + 0.5), 1)
        return _hdr_highest_value(int(np.searchsorted(cumulative, target)))

    def percentiles_ms(self) -> dict[str, float]:
        """:data:`~bench.lab.results.PERCENTILES` in milliseconds; empty when nothing was added."""
        if not self.count:
            return {}
        quantiles = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}
        result = {k: self.value_at_percentile(q) / 1000 for k, q in quantiles.items()}
        result["max"] = _hdr_highest_value(int(np.flatnonzero(self.counts)[-1])) / 1000
        return {k: round(result[k], 3) for k in PERCENTILES}

    def to_hdr(self) -> HdrHistogram:
        """The counts as an ``hdrh`` histogram."""
        histogram = HdrHistogram(HIST_MIN_US, HIST_MAX_US, HIST_DIGITS)
        nonzero = np.flatnonzero(self.counts)
        for index, count in zip(nonzero.tolist(), self.counts[nonzero].tolist(), strict=True):
            histogram.record_value(_hdr_lowest_value(index), count)
        return histogram

    def encoded(self) -> str:
        """The histogram, base64 (``hdrh`` encode); empty when nothing was added."""
        return self.to_hdr().encode().decode("ascii") if self.count else ""


# HDR's layout at 3 significant digits from 1 us: values below 2048 have a bucket each,
# then each power of two has 1024 buckets, each 2**shift wide
_HDR_COUNTS_LEN = HdrHistogram(HIST_MIN_US, HIST_MAX_US, HIST_DIGITS).counts_len
_HALF_MAGNITUDE = 10


def _hdr_index(values: np.ndarray) -> np.ndarray:
    """HDR's counts index of each value (as ``HdrHistogram._counts_index_for``)."""
    shift = np.maximum(np.frexp(values)[1].astype(np.int64) - (_HALF_MAGNITUDE + 1), 0)
    return (shift << _HALF_MAGNITUDE) + (values >> shift)


def _hdr_lowest_value(index: int) -> int:
    """The lowest value counted at HDR counts index ``index``."""
    shift = max((index >> _HALF_MAGNITUDE) - 1, 0)
    return (index - (shift << _HALF_MAGNITUDE)) << shift


def _hdr_highest_value(index: int) -> int:
    """The highest value counted at HDR counts index ``index``."""
    shift = max((index >> _HALF_MAGNITUDE) - 1, 0)
    return _hdr_lowest_value(index) + (1 << shift) - 1


_POWERS_OF_TEN = 10 ** np.arange(DIGITS - 1, -1, -1, dtype=np.int64)


def parse_times(digits: bytes) -> np.ndarray:
    """The scheduled times in ``digits``: DIGITS ASCII digits each, back to back."""
    matrix = np.frombuffer(digits, dtype=np.uint8).reshape(-1, DIGITS).astype(np.int64) - 48
    return matrix @ _POWERS_OF_TEN


def take_values(values: list[int]) -> np.ndarray:
    """The values gathered so far, as an array; ``values`` is left empty (same object)."""
    taken = np.fromiter(values, dtype=np.int64, count=len(values))
    del values[:]
    return taken
