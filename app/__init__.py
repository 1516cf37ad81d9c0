"""onepass: a local System One server answering typed questions from one llama.cpp pass."""
