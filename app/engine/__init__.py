"""llama.cpp and the prefix snapshots: the engine, the RAM cache, the verified disk tier."""

from app.engine.gpu_libraries import load_cuda_libraries

# Before any module here imports llama_cpp: a CUDA build made with NVIDIA's wheels links their
# libraries by name, and the loader finds them only once they are in the process.
load_cuda_libraries()
