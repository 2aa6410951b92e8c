"""Dequantizers of the IQ types (work in progress: grid tables pending)."""

DEQUANTIZERS: dict = {}
