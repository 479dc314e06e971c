"""The benchmark suite: throughput, latency and scaling of the whole pipeline, and component
benchmarks of the source and the sink."""
