"""The exactly-once sink: executors encode rows to Avro; the driver writes each micro-batch in one
Kafka transaction with a progress marker."""
