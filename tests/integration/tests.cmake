# Integration tests: whole `charm` processes (serve + workers) driven over HTTP by the
# official `openai` Python client, and `charm status`. Included from tests/CMakeLists.txt.

find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME integration_api
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_api.py
            --charm $<TARGET_FILE:charm>
            --config ${PROJECT_SOURCE_DIR}/configs/local-cluster.yaml
            --source-dir ${PROJECT_SOURCE_DIR})
  set_tests_properties(integration_api PROPERTIES LABELS integration TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()

# The CLI's exit codes and error messages, without a model.
add_test(NAME integration_cli
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_cli.sh $<TARGET_FILE:charm>)
set_tests_properties(integration_cli PROPERTIES LABELS integration TIMEOUT 120)
