# Runs `deepinfer json-schema-suite SUITE`; reports a skip when the suite is not present
# (SKIP_REGULAR_EXPRESSION in CMakeLists.txt: CMake 3.25 has no cmake_language(EXIT)).
if(NOT EXISTS "${SUITE}")
  message("JSON-Schema-Test-Suite not found at ${SUITE}; SKIPPED")
  return()
endif()
execute_process(COMMAND "${CLI}" json-schema-suite "${SUITE}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "json-schema-suite exited with ${rc}")
endif()
