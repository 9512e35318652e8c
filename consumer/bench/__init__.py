"""Benchmarks behind ``kbatch bench …`` (commands with JSON output, never timed tests)."""
