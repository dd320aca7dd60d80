# CUDA execution-provider kernels of onnxfuse_ops: included by ../CMakeLists.txt when ONNXFUSE_WITH_CUDA is ON.
# Reads ONNXFUSE_CUDA_ARCHS ("90", "80;90"), ONNXFUSE_WITH_TRITON, ONNXFUSE_PYTHON and the target
# onnxfuse_ops. Needs nvcc (CUDAToolkit) but no GPU: Triton cubins are compiled for the named archs with
# triton.compile(target=GPUTarget("cuda", arch, 32)).
#
# Targets: onnxfuse_cuda (the hand-written kernels cuda/*.cu and the CUDA EP glue cuda/*.cc) and, with Triton,
# onnxfuse_triton (the AOT cubins, generated as triton_kernels.h, and their runtime cuda/triton/runtime.cc; each
# family's Triton launcher sits at the end of its glue cuda/<family>_ops.cc, under ONNXFUSE_WITH_TRITON). Without
# Triton nothing of cuda/triton/ is compiled: the glue knows it at compile time (ONNXFUSE_WITH_TRITON,
# cuda/ops_cuda.h) and answers backend=triton with ONNXFUSE_ERR_NO_TRITON. Sources are globbed
# per folder (CONFIGURE_DEPENDS), so a new op's files need no edit here.
#
# Linking: the CUDA runtime is linked statically (cudart_static) and nothing links libcuda, so the library loads on
# machines without a driver (CPU-only onnxruntime); the CUDA kernels simply never run there. The CUDA backend's GEMMs
# are cuBLASLt's, loaded at run time with dlopen (cuda/gemm.cu, declarations in cuda/cublaslt_api.h): nothing links
# libcublasLt, so neither the build needs cuBLAS headers nor the library needs libcublasLt.so to load.
#
# Optional cache variables:
#   ONNXFUSE_TRITON_CONFIGS  JSON file of tile configs per arch applied over triton/tuned.json (aot.py --configs)
#   ONNXFUSE_TRITON_JOBS     parallel Triton compilations (default: number of CPUs)

if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS "/usr/local/cuda/bin/nvcc")
  set(CMAKE_CUDA_COMPILER "/usr/local/cuda/bin/nvcc")
endif()
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  # We pass -gencode flags ourselves (below); this only keeps CMake's compiler check from probing a GPU.
  set(CMAKE_CUDA_ARCHITECTURES OFF)
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
message(STATUS "onnxfuse: CUDA kernels with nvcc ${CMAKE_CUDA_COMPILER_VERSION} for sm_${ONNXFUSE_CUDA_ARCHS}, "
               "Triton: ${ONNXFUSE_WITH_TRITON}")

set(_onnxfuse_cuda_dir "${CMAKE_CURRENT_SOURCE_DIR}/cuda")
set(_onnxfuse_triton_dir "${CMAKE_CURRENT_SOURCE_DIR}/triton")

file(GLOB _onnxfuse_cuda_sources CONFIGURE_DEPENDS "${_onnxfuse_cuda_dir}/*.cu" "${_onnxfuse_cuda_dir}/*.cc")
add_library(onnxfuse_cuda OBJECT ${_onnxfuse_cuda_sources})
onnxfuse_kernel_target(onnxfuse_cuda)

# One SASS per arch, plus PTX of the highest one so that newer GPUs can JIT it. The hand-written kernels here are
# elementwise and gather kernels (the GEMMs are cuBLASLt's), so no sm_90a; Triton builds its own sm_90a cubins.
set(_onnxfuse_gencode "")
set(_onnxfuse_max_arch 0)
foreach(arch IN LISTS ONNXFUSE_CUDA_ARCHS)
  if(NOT arch MATCHES "^[0-9]+$")
    message(FATAL_ERROR "ONNXFUSE_CUDA_ARCHS entries must be plain numbers like 80 or 90, got '${arch}'")
  endif()
  if(arch LESS 80)
    message(FATAL_ERROR "onnxfuse CUDA kernels need sm_80 or newer (bf16 tensor cores), got sm_${arch}")
  endif()
  list(APPEND _onnxfuse_gencode "-gencode=arch=compute_${arch},code=sm_${arch}")
  if(arch GREATER _onnxfuse_max_arch)
    set(_onnxfuse_max_arch ${arch})
  endif()
endforeach()
list(APPEND _onnxfuse_gencode "-gencode=arch=compute_${_onnxfuse_max_arch},code=compute_${_onnxfuse_max_arch}")

set_target_properties(onnxfuse_cuda PROPERTIES
  CUDA_ARCHITECTURES OFF
  CUDA_STANDARD 17
  CUDA_STANDARD_REQUIRED ON
  CUDA_VISIBILITY_PRESET hidden)
target_compile_options(onnxfuse_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-O3 ${_onnxfuse_gencode} -Xptxas=-warn-spills -Xcompiler=-fvisibility=hidden>)
target_include_directories(onnxfuse_cuda PRIVATE ${CUDAToolkit_INCLUDE_DIRS})

if(ONNXFUSE_WITH_TRITON)
  if(NOT ONNXFUSE_PYTHON)
    message(FATAL_ERROR "ONNXFUSE_WITH_TRITON=ON needs ONNXFUSE_PYTHON (a python with triton installed)")
  endif()
  set(_onnxfuse_triton_gen "${CMAKE_CURRENT_BINARY_DIR}/triton_generated")
  string(REPLACE ";" "," _onnxfuse_arch_csv "${ONNXFUSE_CUDA_ARCHS}")
  set(_onnxfuse_aot_args --out "${_onnxfuse_triton_gen}/triton_kernels.h" --archs "${_onnxfuse_arch_csv}"
                         --manifest "${_onnxfuse_triton_gen}/triton_kernels.json")
  # aot.py, table.py, gemm_loop.py, the kernels triton/<family>.py and the tuned tile configs.
  file(GLOB _onnxfuse_aot_deps CONFIGURE_DEPENDS "${_onnxfuse_triton_dir}/*.py" "${_onnxfuse_triton_dir}/*.json")
  if(ONNXFUSE_TRITON_CONFIGS)
    list(APPEND _onnxfuse_aot_args --configs "${ONNXFUSE_TRITON_CONFIGS}")
    list(APPEND _onnxfuse_aot_deps "${ONNXFUSE_TRITON_CONFIGS}")
  endif()
  if(ONNXFUSE_TRITON_JOBS)
    list(APPEND _onnxfuse_aot_args --jobs ${ONNXFUSE_TRITON_JOBS})
  endif()
  add_custom_command(
    OUTPUT "${_onnxfuse_triton_gen}/triton_kernels.h"
    COMMAND ${CMAKE_COMMAND} -E make_directory "${_onnxfuse_triton_gen}"
    COMMAND ${ONNXFUSE_PYTHON} "${_onnxfuse_triton_dir}/aot.py" ${_onnxfuse_aot_args}
    DEPENDS ${_onnxfuse_aot_deps}
    COMMENT "onnxfuse: Triton AOT compilation for sm_${_onnxfuse_arch_csv}"
    VERBATIM)
  add_custom_target(onnxfuse_triton_aot DEPENDS "${_onnxfuse_triton_gen}/triton_kernels.h")
  file(GLOB _onnxfuse_triton_sources CONFIGURE_DEPENDS "${_onnxfuse_cuda_dir}/triton/*.cc")
  add_library(onnxfuse_triton OBJECT ${_onnxfuse_triton_sources})
  onnxfuse_kernel_target(onnxfuse_triton)
  add_dependencies(onnxfuse_triton onnxfuse_triton_aot)
  # runtime.cc includes the cubin table.
  set_source_files_properties(${_onnxfuse_cuda_dir}/triton/runtime.cc PROPERTIES
    OBJECT_DEPENDS "${_onnxfuse_triton_gen}/triton_kernels.h")
  target_include_directories(onnxfuse_triton PRIVATE "${_onnxfuse_triton_gen}" ${CUDAToolkit_INCLUDE_DIRS})
  target_sources(onnxfuse_ops PRIVATE $<TARGET_OBJECTS:onnxfuse_triton>)
endif()

target_sources(onnxfuse_ops PRIVATE $<TARGET_OBJECTS:onnxfuse_cuda>)
# The link pulls in CUDA objects: no device link (no -rdc), the static runtime, and no arch probing.
set_target_properties(onnxfuse_ops PROPERTIES CUDA_ARCHITECTURES OFF CUDA_RUNTIME_LIBRARY Static)
target_link_libraries(onnxfuse_ops PRIVATE CUDA::cudart_static ${CMAKE_DL_LIBS})
