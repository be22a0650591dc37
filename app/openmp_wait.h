// How the OpenMP threads of a charm process wait between parallel regions, chosen from
// its command line before libgomp loads (app/charm.cpp re-executes charm with the
// environment below; libgomp reads it only at load).
//
// Why two ways: a decode step runs dozens of short parallel regions per token (every
// projection, the router, the experts' phases). Threads that sleep at once are woken by
// futex for each one, and on a VM a woken vCPU takes tens of microseconds to run: single
// node decode measured 53-57 tok/s passive against 63-68 spinning first (Q8_0 GGUF, 2
// threads; docs/benchmarks.md). But several charm processes sharing a machine (the local
// cluster of scripts/serve.sh) steal each other's cores when they spin: a per-layer round
// trip took ~21 ms instead of ~0.1 ms on 2 cores. So a process that runs alone spins a
// bounded while and then sleeps; every other process sleeps at once. The bound is short
// (kSpinCount): the regions of one decode step follow each other within microseconds, and
// a long spin costs dearly when another program holds one of the cores. Single node, 2
// threads, Q4_K_M GGUF under q8, decode tok/s (docs/benchmarks.md): quiet 84 / 86 / 83 /
// 75 for GOMP_SPINCOUNT 300000 / 3000 / 1000 / 0 (passive), and with a busy loop on one
// core 26 / 38 / 43 / 47.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace charm {

/// How OpenMP threads wait for the next parallel region.
enum class OpenmpWait {
  kPassive,        ///< sleep at once (OMP_WAIT_POLICY=passive)
  kSpinThenSleep,  ///< spin kSpinCount iterations (about 30 us by libgomp's estimate), then sleep
};

/// The spin count (GOMP_SPINCOUNT; about 100000 spins per millisecond by libgomp's
/// estimate): a hundredth of libgomp's default when no policy is set, which measured as
/// fast on an idle machine and 1.45x faster beside a busy core (see above). Set
/// explicitly it also applies where there are more threads than CPUs, where libgomp's
/// unset default would spin only 100.
constexpr long kSpinCount = 3000;

/// The wait for the command line `args` (argv[1..]): kSpinThenSleep for `charm bench`
/// and for `charm run` / `charm serve` whose --config names a `mode: single-node`
/// topology (one process computes everything); kPassive for everything else, including
/// a topology file that cannot be read or parsed (the command's own load then reports
/// it). Reads only the file's `mode` key (no validation, no secret files, no logging);
/// throws nothing.
OpenmpWait openmp_wait_for(const std::vector<std::string>& args);

/// The environment that gives `wait` to libgomp, as (name, value) pairs:
/// OMP_WAIT_POLICY=passive, plus GOMP_SPINCOUNT=kSpinCount for kSpinThenSleep (libgomp
/// takes a GOMP_SPINCOUNT whatever the policy).
std::vector<std::pair<std::string, std::string>> openmp_wait_env(OpenmpWait wait);

}  // namespace charm
