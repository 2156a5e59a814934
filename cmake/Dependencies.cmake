# Finds every external dependency once, so subdirectories only link targets.

find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
if(DDP_ENGINE_ONLY)  # bench/gpu/run.sh's build: the engine's own dependencies alone.
  find_package(yaml-cpp CONFIG REQUIRED)
  find_package(ZLIB REQUIRED)
  if(DDP_BUILD_TESTS)
    find_package(GTest CONFIG REQUIRED)
  endif()
  include(${CMAKE_CURRENT_LIST_DIR}/Torch.cmake)
  return()
endif()
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(yaml-cpp CONFIG REQUIRED)
find_package(SQLite3 REQUIRED)
find_package(PostgreSQL REQUIRED)  # libpq: the coordinator's PostgreSQL store (--store)
find_package(ZLIB REQUIRED)
find_package(CURL REQUIRED)  # libcurl: the coordinator's MLflow client (--mlflow-uri)
find_package(OpenSSL REQUIRED)  # TLS file checks and token digests; gRPC links it too.

if(DDP_FUZZ_BUILD)  # The clang fuzz build needs neither LibTorch nor GoogleTest.
  find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
  return()
endif()
find_package(GTest CONFIG REQUIRED)
# prometheus-cpp (Debian's prometheus-cpp-dev): the daemons' /metrics endpoints.
find_package(prometheus-cpp CONFIG REQUIRED)
# Boost.Beast and Boost.Asio with asio::ssl (Debian's libboost-dev, header-only): the
# coordinator's web dashboard over HTTP or HTTPS (coordinator/http/, decision 153).
find_package(Boost 1.74 REQUIRED)
# libsystemd: sd_notify readiness for the daemons' Type=notify units (a no-op when not
# started by systemd).
find_package(PkgConfig REQUIRED)
pkg_check_modules(SYSTEMD REQUIRED IMPORTED_TARGET libsystemd)

include(${CMAKE_CURRENT_LIST_DIR}/Torch.cmake)  # LibTorch: which flavour, and checked.

find_program(DDP_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT DDP_PYTHON3)
  find_program(DDP_PYTHON3 python3)
endif()
# The interpreter with the readers the tests check exports against (PyPI's tensorboard),
# in a venv of its own: scripts/install_test_tools.sh makes it.
set(DDP_TOOLS_PYTHON "${PROJECT_SOURCE_DIR}/.venv-tools/bin/python" CACHE FILEPATH
    "python with PyPI's tensorboard, for the export tests")

find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
