"""The ``toolkiln`` command."""
