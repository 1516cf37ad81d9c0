"""llama.cpp and the prefix snapshots: the engine, the RAM cache, the verified disk tier."""
