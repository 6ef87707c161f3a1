"""The benchmark lab: drivers, matrix runner, profiles and report (``python -m bench.lab``)."""
