"""The sandbox: template processes, the jail, per-language runners and the host<->child protocol."""
