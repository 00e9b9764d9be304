"""Verifiable tasks and rewards."""
