"""Local conveniences for development, tests, chaos and benchmarks (not the job): a broker on this
machine and a Spark standalone cluster."""
