# dfa_kernels_cudnn: the optional "cudnn" AttentionBackend (cuDNN's fused SDPA behind our
# interface; see docs/kernels-cudnn.md). Included from kernels/cuda/CMakeLists.txt.
#
# Needs cudnn.h (CUDA toolkit / cuDNN 9) and the header-only cuDNN C++ frontend, which comes from
# PyPI as `nvidia-cudnn-frontend` (its wheel ships include/cudnn_frontend*.h). Looked up in:
#   -DDFA_CUDNN_FRONTEND_INCLUDE_DIR=...            explicit
#   <repo>/.cache/cudnn-frontend/include            kernels/cuda/cudnn_frontend_setup.sh puts it there
#   <site-packages>/include next to `import cudnn`  a `pip install nvidia-cudnn-frontend`
# Not found: the backend is simply not built (CreateBackend("cudnn") answers UNAVAILABLE).
# libcudnn itself is not linked: it is loaded at run time (see cudnn_sdpa_graphs.h).
option(DFA_WITH_CUDNN "Build the cuDNN attention backend when the cuDNN frontend headers are found" ON)
if(NOT DFA_WITH_CUDNN)
  return()
endif()

set(_dfa_fe_hints ${PROJECT_SOURCE_DIR}/.cache/cudnn-frontend/include)
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  # find_spec does not import the package (which would load its native module).
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import importlib.util, os; s = importlib.util.find_spec('cudnn'); print(os.path.join(os.path.dirname(os.path.dirname(s.origin)), 'include') if s and s.origin else '')"
    OUTPUT_VARIABLE _dfa_fe_py OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_dfa_fe_py)
    list(APPEND _dfa_fe_hints ${_dfa_fe_py})
  endif()
endif()
find_path(DFA_CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h HINTS ${_dfa_fe_hints} NO_DEFAULT_PATH)
find_path(DFA_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include)

if(NOT DFA_CUDNN_FRONTEND_INCLUDE_DIR OR NOT DFA_CUDNN_INCLUDE_DIR)
  message(STATUS "DFA: cuDNN backend OFF (frontend headers: ${DFA_CUDNN_FRONTEND_INCLUDE_DIR}, cudnn.h: "
                 "${DFA_CUDNN_INCLUDE_DIR}; run kernels/cuda/cudnn_frontend_setup.sh)")
  return()
endif()
message(STATUS "DFA: cuDNN backend ON (frontend ${DFA_CUDNN_FRONTEND_INCLUDE_DIR})")

add_library(dfa_kernels_cudnn STATIC cudnn_backend.cc cudnn_sdpa_graphs.cc cudnn_rowops.cu)
target_include_directories(dfa_kernels_cudnn PUBLIC ${PROJECT_SOURCE_DIR})
# SYSTEM: the frontend's own warnings are not ours to fix (-Werror applies to our code only).
target_include_directories(dfa_kernels_cudnn SYSTEM PRIVATE ${DFA_CUDNN_FRONTEND_INCLUDE_DIR} ${DFA_CUDNN_INCLUDE_DIR})
target_compile_definitions(dfa_kernels_cudnn PRIVATE NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING=1)
target_link_libraries(dfa_kernels_cudnn PUBLIC absl::status absl::statusor absl::strings
                                        PRIVATE dfa_kernels_cuda CUDA::cudart_static ${CMAKE_DL_LIBS})
target_compile_options(dfa_kernels_cudnn PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-O3>)
set_target_properties(dfa_kernels_cudnn PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
dfa_warnings(dfa_kernels_cudnn)
