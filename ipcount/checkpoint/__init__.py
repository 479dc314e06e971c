"""What ipcount reads from and keeps in a query's Spark checkpoint, from Python: the offset log
(each batch's watermarks and source offsets) and the sink's commit receipts."""
