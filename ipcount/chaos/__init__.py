"""The chaos suite: kills the running job at planned fault points and the broker on a schedule,
then checks the sink is still exact. Outside the job's packages."""
