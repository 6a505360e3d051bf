"""Talking to services outside the process (model endpoints, search providers, SMTP
servers): every answer read with a byte cap and a deadline (``cap``, ``http``), every name
looked up within the caller's time (``lookup``)."""
