"""The bench's workloads, a module each; bench/run.py runs the sections it is asked for."""
