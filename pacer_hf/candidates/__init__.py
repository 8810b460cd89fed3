"""Candidate sources for prompt lookup: the request's own text and, opt-in, earlier requests (`suffix.py`)."""

from .suffix import ScopedSuffixCache, SuffixCache, SuffixMatch, SuffixSource, SuffixStore, gate_features

__all__ = ["ScopedSuffixCache", "SuffixCache", "SuffixMatch", "SuffixSource", "SuffixStore", "gate_features"]
