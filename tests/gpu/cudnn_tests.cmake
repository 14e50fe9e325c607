# Tests and benchmark of the cuDNN backend (kernels/cuda/cudnn_*). Included from
# tests/gpu/CMakeLists.txt. The geometry test is pure CPU arithmetic and always runs; the backend
# test and the benchmark exist when the backend is built (the test skips without GPU/libcudnn).
dfa_test(cudnn_unit_geometry_test SOURCES cudnn_unit_geometry_test.cc LIBS dfa_kernels LABELS kernels)
dfa_test(cudnn_interface_test SOURCES cudnn_interface_test.cc LIBS dfa_kernels LABELS kernels)
if(TARGET dfa_kernels_cudnn)
  dfa_test(cudnn_backend_test SOURCES cudnn_backend_test.cc
           LIBS dfa_kernels dfa_kernels_cudnn dfa_reference LABELS gpu)
  add_executable(dfa_cudnn_bench cudnn_bench.cc)
  target_link_libraries(dfa_cudnn_bench PRIVATE dfa_kernels dfa_kernels_cudnn CUDA::cudart_static absl::strings)
  dfa_warnings(dfa_cudnn_bench)
endif()
