"""The correctness and perf suites, run through the fa-harness pytest plugin."""
