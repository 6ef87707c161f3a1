"""Microbenchmarks of chatlab's hot paths, each runnable as ``python -m bench.<name>``."""
