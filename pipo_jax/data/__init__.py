"""Tokenizers, dataset sources, padding buckets."""
