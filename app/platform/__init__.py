"""This machine: CPU flags, the build check, speed tuning, the tiny GGUF (the ops tools are in tools/)."""
