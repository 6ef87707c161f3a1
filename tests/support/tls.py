"""The throwaway CA under its former name: it moved to :mod:`chatlab.throwaway_ca`, which
the lab uses too (kept for branches written against this name; remove once none imports it)."""

from chatlab.throwaway_ca import ThrowawayCA, make_ca

__all__ = ["ThrowawayCA", "make_ca"]
