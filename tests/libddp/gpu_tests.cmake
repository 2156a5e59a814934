# libddp's GPU tests (label gpu; each skips itself where no CUDA GPU is visible): a program
# on the public API, linked against libddp.so as a user's is. Included by tests/ and by
# the GPU check's engine-only build (bench/gpu/run.sh).
add_executable(libddp_cuda_test ${CMAKE_CURRENT_LIST_DIR}/cuda_test.cc
               ${CMAKE_CURRENT_LIST_DIR}/../common/ports.cc)
target_include_directories(libddp_cuda_test PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(libddp_cuda_test PRIVATE ddp::ddp ddp_common GTest::gmock GTest::gtest_main
                      absl::status absl::statusor absl::strings absl::synchronization)
add_test(NAME libddp_cuda_test COMMAND libddp_cuda_test)
set_tests_properties(libddp_cuda_test PROPERTIES LABELS "gpu;engine" TIMEOUT 300)
# ddp::FusedAdamW, FusedAdam and FusedSGD, one case per run, for
# fused_optimizer_parity_test.py (torch.optim with fused=True live beside it): on the CPU
# in ctest (tests/CMakeLists.txt), and on the GPU, CUDA graphs included, with
#   python3 tests/libddp/fused_optimizer_parity_test.py <this program> --device cuda
add_executable(libddp_fused_optimizer_program ${CMAKE_CURRENT_LIST_DIR}/fused_optimizer_program.cc)
target_link_libraries(libddp_fused_optimizer_program PRIVATE ddp::ddp)
target_compile_definitions(libddp_fused_optimizer_program PRIVATE
                           DDP_WITH_CUDA=$<BOOL:${DDP_WITH_CUDA}>)

# The engine's CUDA-graph pieces (libddp/engine/cuda_graph.h): on the CPU in every build
# (label unit), on a GPU too (label gpu: the capture tests skip themselves elsewhere).
add_executable(cuda_graph_test ${CMAKE_CURRENT_LIST_DIR}/engine/cuda_graph_test.cc)
target_link_libraries(cuda_graph_test PRIVATE ddp_engine GTest::gmock GTest::gtest_main)
target_include_directories(cuda_graph_test PRIVATE ${PROJECT_SOURCE_DIR})
add_test(NAME cuda_graph_test COMMAND cuda_graph_test)
set_tests_properties(cuda_graph_test PROPERTIES LABELS "unit;gpu" TIMEOUT 300)
