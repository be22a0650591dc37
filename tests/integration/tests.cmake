# Integration tests: whole `charm` processes (serve + workers) driven over HTTP by the
# official `openai` Python client, and `charm status`. Included from tests/CMakeLists.txt.

find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME integration_api
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_api.py
            --charm $<TARGET_FILE:charm>
            --config ${PROJECT_SOURCE_DIR}/configs/local-cluster.yaml
            --source-dir ${PROJECT_SOURCE_DIR})
  set_tests_properties(integration_api PROPERTIES LABELS integration TIMEOUT 600)
endif()

# The CLI's exit codes and error messages, without a model.
add_test(NAME integration_cli
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_cli.sh $<TARGET_FILE:charm>)
set_tests_properties(integration_cli PROPERTIES LABELS integration TIMEOUT 120)

# Replicas and failover on a real multi-host cluster (one network namespace per worker;
# falls back to 127.0.0.1 ports where namespaces cannot be made), and a bounded load test.
if(Python3_Interpreter_FOUND)
  add_test(NAME integration_failover
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_failover.py
            --charm $<TARGET_FILE:charm> --source-dir ${PROJECT_SOURCE_DIR})
  add_test(NAME integration_load
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_load.py
            --charm $<TARGET_FILE:charm> --source-dir ${PROJECT_SOURCE_DIR})
  # A worker that goes silent (SIGSTOP, a cut link) with the default timeouts: the stream
  # goes on after a learned deadline, not request_ms.
  add_test(NAME integration_frozen_worker
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_frozen_worker.py
            --charm $<TARGET_FILE:charm> --source-dir ${PROJECT_SOURCE_DIR})
  set_tests_properties(integration_failover integration_load integration_frozen_worker PROPERTIES
    LABELS integration TIMEOUT 300 ENVIRONMENT OMP_WAIT_POLICY=passive
    RESOURCE_LOCK charm_cluster_ports)
endif()

# Continuous batching through HTTP on single-node servers (free ports): endpoints answer
# while 32 streams run, batch-invariant greedy answers, 429 when the queue is full, a
# client hanging up mid-prefill frees its sequence, the prefix cache.
if(Python3_Interpreter_FOUND)
  add_test(NAME integration_serving
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_serving.py
            --charm $<TARGET_FILE:charm> --source-dir ${PROJECT_SOURCE_DIR})
  set_tests_properties(integration_serving PROPERTIES
    LABELS integration TIMEOUT 300 ENVIRONMENT OMP_WAIT_POLICY=passive)
endif()

# The dashboard (/) in Debian's headless Chromium against a real two-worker cluster: no
# console errors, every worker shown, numbers that change after requests. Chromium missing
# is a failure (scripts/setup.sh installs it with the tests).
if(Python3_Interpreter_FOUND)
  add_test(NAME integration_dashboard
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_dashboard.py
            --charm $<TARGET_FILE:charm>
            --config ${PROJECT_SOURCE_DIR}/configs/local-cluster.yaml
            --source-dir ${PROJECT_SOURCE_DIR})
  set_tests_properties(integration_dashboard PROPERTIES
    LABELS integration TIMEOUT 300 ENVIRONMENT OMP_WAIT_POLICY=passive)
endif()
