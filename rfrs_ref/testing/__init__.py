"""Hypothesis strategies and law checkers for SPEC §9, usable on any implementation."""
