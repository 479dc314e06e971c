"""Record formats shared by the job, the generator and the consumers: the nginx access line
(input) and the Avro result record (output)."""
