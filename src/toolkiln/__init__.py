"""Toolkiln: a self-hosted runtime for custom AI-agent tools."""

__version__ = "0.1.0"
