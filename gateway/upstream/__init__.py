"""The forward and relay stages: attempts on backends (retries only before the first byte),
the answer relayed chunk by chunk under the request's deadline with the public model name,
shadow mirroring, the backend monitors, and the translation of client errors into the
client's answer. The HTTP clients themselves live in :mod:`gateway.http`."""
