"""Benchmarks behind ``mrtpo bench ...`` (reusable code; the CLI modules only parse options and print)."""
