"""This machine: CPU flags, the build check, the doctor, the GPU check, speed tuning, the tiny GGUF."""
