# Runs CLI with ARGS and fails unless it exits with EXPECTED.
execute_process(COMMAND ${CLI} ${ARGS} RESULT_VARIABLE result OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT result EQUAL EXPECTED)
  message(FATAL_ERROR "'${CLI} ${ARGS}' exited with ${result}, expected ${EXPECTED}: ${err}")
endif()
