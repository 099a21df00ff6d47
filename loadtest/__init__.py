"""The validation tool (``python -m loadtest``): evaluates any OpenAI-compatible endpoint over HTTP.

It never imports the gateway (tests/loadtest/test_http_only.py). Benchmarks of this gateway,
run from a checkout, live in :mod:`loadtest.bench`. Not shipped in the runtime image.
"""
