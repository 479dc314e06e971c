"""The exactly-once sink: each sink task encodes its rows to Avro and writes them in a Kafka
transaction of its own with its partition's progress marker; the driver then records the batch in
the query's marker."""
