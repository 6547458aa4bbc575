# Runs CLI with ARGS; fails unless it exits with EXPECTED and its stderr matches STDERR_REGEX.
execute_process(COMMAND ${CLI} ${ARGS} RESULT_VARIABLE result OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT result EQUAL EXPECTED)
  message(FATAL_ERROR "'${CLI} ${ARGS}' exited with ${result}, expected ${EXPECTED}: ${err}")
endif()
if(DEFINED STDERR_REGEX AND NOT err MATCHES "${STDERR_REGEX}")
  message(FATAL_ERROR "stderr of '${CLI} ${ARGS}' does not match '${STDERR_REGEX}': ${err}")
endif()
