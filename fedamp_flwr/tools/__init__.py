"""What people run beside a run: the ``fedamp-flwr`` command (check-data, predict, forget,
report, ...), a member's erasure from a run's files, and both apps in one process (the
in-process engine of tests, benchmarks and ``simulation.py --engine inprocess``)."""
