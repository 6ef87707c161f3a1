"""chat_server.tail without a server: histograms, GC timing and the quiet collector."""

from __future__ import annotations

import gc
import time

import pytest

from chat_server.tail import PAUSE_BUCKETS_S, GcWatch, PlainHistogram, QuietCollector


def test_plain_histogram_counts_each_value_in_the_first_bucket_it_fits():
    histogram = PlainHistogram((0.001, 0.01, 0.1))
    for value in (0.0005, 0.001, 0.002, 0.5):
        histogram.observe(value)
    # le semantics: 0.001 belongs to the 0.001 bucket; 0.5 to +Inf
    assert histogram.counts == [2, 1, 0, 1]
    assert histogram.count == 4
    assert histogram.max == 0.5
    assert histogram.sum == pytest.approx(0.5035)


def test_gc_watch_times_every_collection_by_generation():
    watch = GcWatch()
    watch.install()
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        watch.uninstall()
    assert watch.pauses[0].count >= 1
    assert watch.pauses[2].count >= 1
    assert watch.pauses[2].bounds == PAUSE_BUCKETS_S
    counted = watch.pauses[2].count
    gc.collect(2)  # uninstalled: not counted
    assert watch.pauses[2].count == counted


def test_quiet_collector_collects_once_the_server_is_idle():
    collector = QuietCollector(lambda: 7, min_interval_s=0.0, max_interval_s=3600.0)
    collector.on_tick(0.0)
    assert collector.collections == 0  # idle for no time yet
    time.sleep(1.1)  # idle past QUIET_FOR_S on the collector's own clock: what is tested
    collector.on_tick(0.0)
    assert collector.collections == 1
    collector.on_tick(0.0)
    time.sleep(1.1)  # the same idle spell, longer
    collector.on_tick(0.0)
    assert collector.collections == 1  # one collection per idle spell


def test_quiet_collector_collects_under_load_when_overdue():
    frames = iter(range(1_000_000))
    collector = QuietCollector(lambda: next(frames), min_interval_s=0.0, max_interval_s=0.2)
    collector.on_tick(0.0)
    assert collector.collections == 0
    time.sleep(0.3)  # past max_interval_s on the collector's own clock: what is tested
    collector.on_tick(0.0)  # never idle, but overdue
    assert collector.collections == 1
