// Ctrl-C (SIGINT), SIGTERM, SIGHUP and a closed output (SIGPIPE) for the `dfa` commands.
//
// Mode kCleanUpAndExit (dfa submit, demo, bench): on the first signal a watcher thread runs the
// registered clean-ups, latest first (a ClusterHold cancels its job and releases its session;
// a local cluster is stopped), says so on stderr and exits with 128 + the signal (130 for
// Ctrl-C) without unwinding the main thread, which may be blocked in a transfer or a job's
// watch. A second signal exits at once. RunCommand does not report the main thread's own
// failure (a cancelled job) once a signal arrived: it waits for the watcher's exit.
//
// Mode kFlagOnly (dfa cluster; any command while it starts a local cluster): a signal only sets
// Requested() and wakes WaitFor(); the command stops by itself. Without Install() the default
// actions stay (the process dies).
//
// SIGHUP (the terminal went away) is one more such signal. A closed output is another: when
// stdout or stderr has lost its reader (`dfa demo | head -1` once head has exited) — seen on
// the SIGPIPE of a write, or by the watcher's look every 200 ms while nothing is written — it
// is an interrupt like the others, as SIGPIPE (exit 141 in mode kCleanUpAndExit, the clean-ups
// run first). A SIGPIPE from a connection is ignored (the write fails with EPIPE). A second
// signal exits at once; SIGPIPE never counts as that second signal (writes to the broken
// output repeat it).
//
// The signal handler only writes to a pipe (async-signal-safe); all work is on the watcher
// thread. Process-wide state.
#pragma once

#include <functional>
#include <string>

#include "absl/time/time.h"

namespace dfa::cli {

class Interrupts {
 public:
  enum class Mode { kCleanUpAndExit, kFlagOnly };

  // Installs the handlers for SIGINT, SIGTERM, SIGHUP and SIGPIPE; `command` names the program in messages
  // ("dfa submit"). Later calls change only the mode and the name.
  static void Install(const std::string& command, Mode mode);
  static bool Installed();
  // True once a signal arrived; the signal's number (0 when none).
  static bool Requested();
  static int Signal();
  // Sleeps up to `d`; returns true as soon as a signal has arrived.
  static bool WaitFor(absl::Duration d);
  // In mode kCleanUpAndExit after a signal: blocks until the watcher exits the process.
  // Returns at once otherwise.
  static void BlockIfExiting();
  // After a signal (in either mode): runs the clean-ups and exits 128 + the signal, on this
  // thread. Returns at once when none arrived. For a command that starts something in mode
  // kFlagOnly (a local cluster, which cannot be stopped half-started) and then switches to
  // kCleanUpAndExit with its clean-up registered.
  static void CleanUpAndExitIfRequested();

  // A clean-up for mode kCleanUpAndExit (`what` is printed as it runs, e.g. "stopping the
  // local cluster"); returns a handle for RemoveCleanup. RemoveCleanup waits for a clean-up
  // that is running.
  static int AddCleanup(const std::string& what, std::function<void()> fn);
  static void RemoveCleanup(int handle);
};

}  // namespace dfa::cli
