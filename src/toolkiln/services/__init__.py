"""Use cases. They depend on the domain and on the ports in ``ports``, never on a framework."""
