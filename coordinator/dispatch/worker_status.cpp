#include "coordinator/dispatch/worker_status.h"

#include <string>

#include "common/error.h"

namespace charm {

const char* worker_state_name(WorkerState state) {
  switch (state) {
    case WorkerState::kUp: return "up";
    case WorkerState::kSuspect: return "suspect";
    case WorkerState::kDown: return "down";
    case WorkerState::kInProcess: return "in-process";
  }
  return "down";  // unreachable: every enumerator is named above
}

WorkerState parse_worker_state(std::string_view name) {
  for (WorkerState s : {WorkerState::kUp, WorkerState::kSuspect, WorkerState::kDown, WorkerState::kInProcess}) {
    if (name == worker_state_name(s)) return s;
  }
  fail_protocol("worker state \"" + std::string(name) + "\" is not one of up, suspect, down, in-process");
}

}  // namespace charm
