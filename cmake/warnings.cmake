function(deepinfer_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
      -Wcast-align -Wunused -Woverloaded-virtual -Wimplicit-fallthrough>)
  if(DEEPINFER_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  # GCC 12 at -O3 reports std::string's `"literal" + std::string&&` as a memcpy overlap
  # (-Wrestrict false positive, GCC bug 105329, fixed in 13); it broke Release builds.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
  endif()
endfunction()

# deepinfer_add_test(NAME src...) : one GoogleTest executable per layer, discovered by ctest.
function(deepinfer_add_test name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE deepinfer GTest::gtest GTest::gtest_main)
  # tests/ holds headers every layer's tests share (gpu_support.h).
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${name} PRIVATE
    DEEPINFER_SHARED_DIR="${DEEPINFER_SHARED_DIR}"
    DEEPINFER_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  deepinfer_set_warnings(${name})
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
endfunction()
