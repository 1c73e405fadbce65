"""Built-in benchmarks, one file each, named after the benchmark; ``BENCHMARKS.get(name)`` imports it on demand."""
