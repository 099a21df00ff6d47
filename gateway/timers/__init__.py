"""Time on the hot path: the coarse deadline wheel (one timer per loop, not one per wait) and
the jittered back-off that reconnecting clients share."""
