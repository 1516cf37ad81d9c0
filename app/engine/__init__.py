"""llama.cpp and the prefix snapshots: the engine, the RAM cache, the verified disk tier.

Importing it loads nothing: llama.cpp is loaded by app.engine.bindings.init()."""
