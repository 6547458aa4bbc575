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
  deepinfer_enable_unity_build(${name})
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
endfunction()

# deepinfer_enable_unity_build(TARGET [BATCH_SIZE]) : batches TARGET's C++ sources when
# DEEPINFER_UNITY_BUILD is on. Batches of 8 (the default) keep both cores of a CI machine busy
# while most of the library's headers are shared within a batch; a source that cannot share a
# translation unit (file-local names that collide) opts out with the SKIP_UNITY_BUILD_INCLUSION
# source property.
function(deepinfer_enable_unity_build target)
  set(batch_size 8)
  if(ARGC GREATER 1)
    set(batch_size ${ARGV1})
  endif()
  if(DEEPINFER_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE BATCH
                                               UNITY_BUILD_BATCH_SIZE ${batch_size})
    # GCC's -Wsubobject-linkage is meant for headers: a type with a member of an anonymous-
    # namespace type, defined outside the main file, would be an ODR hazard. In a unity batch
    # every .cpp is an included file, so each .cpp's own Impl with file-local members warns;
    # non-unity builds keep the check.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>)
    endif()
  endif()
endfunction()
