"""Built-in tools, one module each."""
