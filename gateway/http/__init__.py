"""HTTP plumbing shared by the edge and the pipeline: raw ASGI helpers (bounded body reads,
JSON and error answers, header lookup). The server protocol and the upstream client live
beside them."""
