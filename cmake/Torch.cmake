# LibTorch, in one of two flavours (docs/torch.md):
#   - Debian's CPU LibTorch 1.13 (libtorch-dev): the default, found on the system;
#   - PyPI's torch 2.x (its CUDA build) in a virtual environment, made by
#     scripts/install_torch2.sh: -DDDP_TORCH_PYTHON=.venv-torch2/bin/python.
# Any other LibTorch: point CMAKE_PREFIX_PATH (or Torch_DIR) at it, with
# CMAKE_LIBRARY_PATH at its lib/ where Debian's libtorch-dev is installed too.
#
# Every way a torch install can be wrong that we know of ends here with a message that
# names the fix, before a compiler sees a header: no venv, a torch that does not import,
# another version than DDP_TORCH_VERSION, a CPU-only wheel with DDP_REQUIRE_CUDA, a CUDA
# wheel without the CUDA toolkit, and one LibTorch's headers with another's libc10.
set(DDP_TORCH_PYTHON "" CACHE FILEPATH
    "The Python of a virtual environment with PyPI's torch (scripts/install_torch2.sh); empty: Debian's LibTorch")
set(DDP_TORCH_VERSION "2.11.0" CACHE STRING
    "The torch version DDP_TORCH_PYTHON must have (empty: any)")
option(DDP_REQUIRE_CUDA "Fail unless the LibTorch found is a CUDA build (the NCCL path compiled)" OFF)

set(_ddp_torch_fix "run scripts/install_torch2.sh (it makes .venv-torch2) and configure with -DDDP_TORCH_PYTHON=<repo>/.venv-torch2/bin/python")
if(DDP_TORCH_PYTHON)
  if(NOT EXISTS "${DDP_TORCH_PYTHON}" OR IS_DIRECTORY "${DDP_TORCH_PYTHON}")
    message(FATAL_ERROR "DDP_TORCH_PYTHON=${DDP_TORCH_PYTHON}: no such interpreter (no venv there?): ${_ddp_torch_fix}")
  endif()
  execute_process(
    COMMAND "${DDP_TORCH_PYTHON}" -c
      "import os, torch, torch.utils; print(torch.__version__); print(torch.version.cuda or ''); print(torch.utils.cmake_prefix_path); print(os.path.join(os.path.dirname(torch.__file__), 'lib'))"
    RESULT_VARIABLE _ddp_rc OUTPUT_VARIABLE _ddp_out ERROR_VARIABLE _ddp_err
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _ddp_rc EQUAL 0)
    message(FATAL_ERROR "DDP_TORCH_PYTHON=${DDP_TORCH_PYTHON} cannot import torch:\n${_ddp_err}\n${_ddp_torch_fix}")
  endif()
  string(REPLACE "\n" ";" _ddp_out "${_ddp_out}")
  list(LENGTH _ddp_out _ddp_n)
  if(NOT _ddp_n EQUAL 4)
    message(FATAL_ERROR "DDP_TORCH_PYTHON=${DDP_TORCH_PYTHON} printed something else than torch's version, CUDA version and paths: ${_ddp_out}")
  endif()
  list(GET _ddp_out 0 DDP_PIP_TORCH_VERSION)
  list(GET _ddp_out 1 _ddp_cuda)
  list(GET _ddp_out 2 _ddp_prefix)
  list(GET _ddp_out 3 _ddp_libdir)
  string(REGEX REPLACE "\\+.*" "" _ddp_plain_version "${DDP_PIP_TORCH_VERSION}")  # 2.11.0+cu130
  if(DDP_TORCH_VERSION AND NOT _ddp_plain_version VERSION_EQUAL DDP_TORCH_VERSION)
    message(FATAL_ERROR "DDP_TORCH_PYTHON=${DDP_TORCH_PYTHON} has torch ${DDP_PIP_TORCH_VERSION}, and this build expects ${DDP_TORCH_VERSION}: rerun scripts/install_torch2.sh (it pins ${DDP_TORCH_VERSION}), or configure with -DDDP_TORCH_VERSION=${_ddp_plain_version} to build against it anyway")
  endif()
  if(DDP_REQUIRE_CUDA AND NOT _ddp_cuda)
    message(FATAL_ERROR "torch ${DDP_PIP_TORCH_VERSION} at ${DDP_TORCH_PYTHON} is a CPU-only wheel (torch.version.cuda is None), and DDP_REQUIRE_CUDA is on: install the default (CUDA) torch ${DDP_TORCH_VERSION} wheel from PyPI, not one from a CPU-only index: remove the venv and rerun scripts/install_torch2.sh")
  endif()
  if(_ddp_cuda)
    # torch's CUDA package config runs enable_language(CUDA) and find_package(CUDAToolkit).
    find_program(_ddp_nvcc nvcc HINTS ENV CUDAToolkit_ROOT ENV CUDA_HOME PATHS /usr/local/cuda/bin)
    if(NOT _ddp_nvcc AND NOT CMAKE_CUDA_COMPILER)
      message(FATAL_ERROR "torch ${DDP_PIP_TORCH_VERSION} is a CUDA ${_ddp_cuda} build, and its CMake package needs the CUDA toolkit (nvcc), which is not on PATH nor in /usr/local/cuda: install the CUDA toolkit, or set CUDAToolkit_ROOT (or CMAKE_CUDA_COMPILER) to where it is")
    endif()
    if(_ddp_nvcc AND NOT CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_COMPILER "${_ddp_nvcc}" CACHE FILEPATH "nvcc, for torch's CUDA package")
    endif()
  endif()
  # Its lib/ first: torch's config looks for libc10 on the system's paths before its own.
  list(PREPEND CMAKE_PREFIX_PATH "${_ddp_prefix}")
  list(PREPEND CMAKE_LIBRARY_PATH "${_ddp_libdir}")
endif()

find_package(Torch REQUIRED)

# One LibTorch's headers with another's libc10 compiles, links, and fails at run time:
# refuse it here. (TorchConfig.cmake finds libc10 with find_library, whose system paths
# come before torch's own lib/.)
get_filename_component(_ddp_torch_root "${TORCH_INSTALL_PREFIX}" REALPATH)
foreach(_ddp_lib IN ITEMS "${TORCH_LIBRARY}" "${c10_LIBRARY}")
  if(_ddp_lib)
    get_filename_component(_ddp_real "${_ddp_lib}" REALPATH)
    string(FIND "${_ddp_real}" "${_ddp_torch_root}/" _ddp_at)
    if(NOT _ddp_at EQUAL 0)
      message(FATAL_ERROR "LibTorch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX}, but ${_ddp_lib} belongs to another LibTorch (Debian's libtorch-dev?): configure a fresh build dir with -DCMAKE_LIBRARY_PATH=${TORCH_INSTALL_PREFIX}/lib, or with -DDDP_TORCH_PYTHON for a venv's torch")
    endif()
  endif()
endforeach()

# PyPI's torch ships headers of another protobuf in its include/, which is searched
# before the system's on every command line that has LibTorch's: a file that includes
# protobuf's headers and LibTorch's (the trainer's test harness) would compile against
# headers that do not match the libprotobuf it links. DDP_SYSTEM_PROTOBUF_INCLUDE, a
# directory holding only the system's `google`, goes first on the engine's users'
# command lines (the engine's and libddp's targets); other targets are left as they are.
get_filename_component(_ddp_torch_include "${TORCH_INSTALL_PREFIX}/include" REALPATH)
get_filename_component(_ddp_protobuf_include "${Protobuf_INCLUDE_DIR}" REALPATH)
if(EXISTS "${_ddp_torch_include}/google/protobuf" AND Protobuf_INCLUDE_DIR AND
   NOT _ddp_torch_include STREQUAL _ddp_protobuf_include)
  set(DDP_SYSTEM_PROTOBUF_INCLUDE ${CMAKE_BINARY_DIR}/system-protobuf)
  file(MAKE_DIRECTORY ${DDP_SYSTEM_PROTOBUF_INCLUDE})
  file(CREATE_LINK ${Protobuf_INCLUDE_DIR}/google ${DDP_SYSTEM_PROTOBUF_INCLUDE}/google SYMBOLIC)
endif()

# TORCH_CXX_FLAGS carries the ABI define (1.13; 2.x sets none): applied only to the
# trainer targets.
separate_arguments(DDP_TORCH_CXX_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")

set(DDP_WITH_CUDA OFF)
if(TARGET torch_cuda OR CAFFE2_USE_CUDA OR TORCH_CUDA_LIBRARIES)
  set(DDP_WITH_CUDA ON)
endif()
if(DDP_REQUIRE_CUDA AND NOT DDP_WITH_CUDA)
  message(FATAL_ERROR "DDP_REQUIRE_CUDA: LibTorch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX} is a CPU build, so the NCCL path would not be compiled: ${_ddp_torch_fix}")
endif()
# The Python whose torch is the flavour under test, for tests that run PyTorch beside
# it live (a TCPStore as torchrun's agent): the venv's, or Debian's with python3-torch.
if(DDP_TORCH_PYTHON)
  set(DDP_REFERENCE_PYTHON "${DDP_TORCH_PYTHON}")
else()
  set(DDP_REFERENCE_PYTHON /usr/bin/python3)
endif()
message(STATUS "ddp: LibTorch ${Torch_VERSION} at ${Torch_DIR}; CUDA/NCCL path: ${DDP_WITH_CUDA}")
