# The README's main job, end to end: write the embedded default model's weights, then generate
# text from two prompts through the engine. Fails unless both prompts produce output.
set(model_dir ${WORK_DIR}/default-model)
file(REMOVE_RECURSE ${model_dir})
execute_process(COMMAND ${CLI} make-checkpoint --config ${SOURCE_DIR}/models/default/config.json
                        --seed 0 --out ${model_dir}
                RESULT_VARIABLE result ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "make-checkpoint failed (${result}): ${err}")
endif()
file(COPY ${SOURCE_DIR}/models/default/tokenizer.json ${SOURCE_DIR}/models/default/tokenizer_config.json
     DESTINATION ${model_dir})
execute_process(COMMAND ${CLI} generate --model ${model_dir} --max-tokens 8 --json
                        --prompt "The capital of France is" --prompt "def fibonacci(n):"
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "generate failed (${result}): ${err}\n${out}")
endif()
string(REGEX MATCHALL "\"finish_reason\":\"(length|stop)\"" finished "${out}")
list(LENGTH finished count)
if(NOT count EQUAL 2)
  message(FATAL_ERROR "expected two finished completions, got:\n${out}")
endif()
message(STATUS "${out}")
