# libddp's GPU tests (label gpu; each skips itself where no CUDA GPU is visible): a program
# on the public API, linked against libddp.so as a user's is. Included by tests/ and by
# the GPU check's engine-only build (bench/gpu/run.sh).
add_executable(libddp_cuda_test ${CMAKE_CURRENT_LIST_DIR}/cuda_test.cc)
target_link_libraries(libddp_cuda_test PRIVATE ddp::ddp GTest::gmock GTest::gtest_main)
add_test(NAME libddp_cuda_test COMMAND libddp_cuda_test)
set_tests_properties(libddp_cuda_test PROPERTIES LABELS gpu TIMEOUT 300)
