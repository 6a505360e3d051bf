"""HTTP transport: FastAPI app, routes, request models and the one error-to-HTTP mapping."""
