"""Measuring chatlab: the lab (``python -m bench.lab``: matrices of configurations, capacity
climbs, the fast driver, the report), the bare relays it measures the chat server against
(``bench.relay``), the tail at a steady load (``bench.tail``), fault runs, and the
microbenchmarks of single hot paths (codecs, memory, bytes on the wire, argon2 logins),
each runnable as ``python -m bench.<name>``."""
