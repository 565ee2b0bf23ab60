"""Axis letters used in every docstring of the project.

- ``P`` prompts in a batch, ``G`` responses per prompt (group size), ``N = P * G`` responses;
- ``K`` rewards (one per verifier), ``T`` response tokens (right-padded), ``V`` vocabulary;
- ``L`` context (prompt) tokens, ``H`` hidden size; ``C`` contexts replayed for one response.
"""
