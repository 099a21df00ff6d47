"""Parsing a request body into what the pipeline reads (the model, stream, the prompt),
shared by the HTTP edge and batch lines: one decoder, one set of checks (size, depth,
repeated keys), one place that names the proxied endpoints."""
