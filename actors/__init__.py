"""Ray backend: client and server actors, and the RayExecutor that drives them.

fedsim/ (the library) never imports ray; this package wraps it.
"""
