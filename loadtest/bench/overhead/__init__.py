"""Measure the per-request overhead of the gateway's proxy hop.

The benchmark compares three targets under identical load (wrk, POST, keep-alive):
the backend nginx directly, a plain nginx reverse proxy (the floor for any proxy hop),
and the gateway. Run it with ``python -m loadtest.bench.overhead``; see README.md.
"""
