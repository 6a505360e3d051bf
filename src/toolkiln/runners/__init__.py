"""Runners: where tool code runs. The API reaches them over gRPC (wire.py,
client.py, fleet.py) or starts one of its own (local.py); a runner process (process.py,
server.py, host.py) hosts the sandboxes and holds no credential."""
