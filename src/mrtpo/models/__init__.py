"""Hugging Face model helpers: loading by path or hub id, and tiny models built from scratch."""
