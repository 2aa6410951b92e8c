"""gguflm: read, check, write and run GGUF model files."""

__version__ = "0.1.0"
