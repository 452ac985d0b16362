"""Diagnostics the harness reports: device, timing, memory, contract and compile facts."""
