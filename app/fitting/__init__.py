"""Fitting calibration to a user's examples: the run, its jobs, its report, the CLI."""
