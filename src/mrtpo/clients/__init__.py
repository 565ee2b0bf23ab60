"""Clients of outside services, below the tasks and the evaluations that use them
(:mod:`mrtpo.clients.judge`: LLM judges and JSON over HTTP)."""
