# DDP_FUZZ: builds the libFuzzer targets in fuzz/ with clang (ASan + UBSan) in a
# sub-build, <build>/fuzz, and registers a fixed-iteration run of each with ctest
# (label `fuzz`). The main build stays gcc; the sub-build compiles only what the
# fuzzers need (common, proto, the coordinator's core, the data-file parsers).
find_program(DDP_FUZZ_CXX NAMES clang++-14 clang++)
find_program(DDP_FUZZ_CC NAMES clang-14 clang)
if(NOT DDP_FUZZ_CXX OR NOT DDP_FUZZ_CC)
  message(WARNING "DDP_FUZZ: clang not found (apt-get install clang libclang-rt-14-dev); "
                  "the fuzz targets are skipped")
  return()
endif()
cmake_host_system_information(RESULT _ddp_cores QUERY NUMBER_OF_LOGICAL_CORES)
set(DDP_FUZZ_JOBS ${_ddp_cores} CACHE STRING "Parallel jobs of the fuzz sub-build")
# Inputs per target in ctest, about 20-60 s each on a loaded two-core machine: the
# coordinator target writes SQLite on most operations and is much slower per input.
set(DDP_FUZZ_RUNS_job_spec 20000)
set(DDP_FUZZ_RUNS_data_files 50000)
set(DDP_FUZZ_RUNS_text 50000)
set(DDP_FUZZ_RUNS_coordinator 500)

include(ExternalProject)
ExternalProject_Add(ddp_fuzzers
  SOURCE_DIR ${PROJECT_SOURCE_DIR}
  BINARY_DIR ${CMAKE_BINARY_DIR}/fuzz
  CMAKE_GENERATOR Ninja
  CMAKE_ARGS -DCMAKE_BUILD_TYPE=RelWithDebInfo
             -DCMAKE_C_COMPILER=${DDP_FUZZ_CC} -DCMAKE_CXX_COMPILER=${DDP_FUZZ_CXX}
             -DDDP_FUZZ_BUILD=ON -DDDP_DEBUG_INFO=${DDP_DEBUG_INFO}
  BUILD_COMMAND ${CMAKE_COMMAND} --build . -j ${DDP_FUZZ_JOBS}
  BUILD_ALWAYS ON
  INSTALL_COMMAND ""
  USES_TERMINAL_BUILD ON)

foreach(target job_spec data_files text coordinator)
  add_test(NAME fuzz_${target}
           COMMAND bash ${PROJECT_SOURCE_DIR}/fuzz/run_fuzzer.sh
                   ${CMAKE_BINARY_DIR}/fuzz/bin/${target}_fuzzer
                   ${PROJECT_SOURCE_DIR}/fuzz/corpus/${target} ${DDP_FUZZ_RUNS_${target}})
  set_tests_properties(fuzz_${target} PROPERTIES LABELS fuzz TIMEOUT 900)
endforeach()
