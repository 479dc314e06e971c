"""The Kafka streaming source (Python Data Source API): offsets in Spark's checkpoint, driver-side
lookups, executor-side range reads, idle heartbeats."""
