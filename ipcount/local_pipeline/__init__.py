"""One local run of the whole pipeline (broker, topics, job, generator, verify), the steps the
demo, chaos, the soak and the benchmarks share. Outside the job's packages."""
