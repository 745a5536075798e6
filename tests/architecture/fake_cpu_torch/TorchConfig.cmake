# A CPU-only LibTorch as far as cmake/Yolo8Torch.cmake can tell (no CUDA libraries, no CAFFE2_USE_CUDA).
add_library(torch INTERFACE IMPORTED)
set(TORCH_LIBRARIES torch)
set(TORCH_CUDA_LIBRARIES "")
set(Torch_FOUND TRUE)
set(Torch_VERSION 2.11.0)
