"""`ipcount soak`: a live job run for a long time at a steady rate with periodic restarts, and the
figures that must stay flat in the job's age (checkpoint, state store, memory, descriptors)."""
