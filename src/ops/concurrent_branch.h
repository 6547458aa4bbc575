// ops::ConcurrentBranch: a line of ops beside the current one (a second stream on a GPU).
#pragma once

#include "core/device.h"

namespace deepinfer::ops {

// A line of ops beside the current one. A small decode step is a chain of kernels that each wait
// on latency rather than bandwidth, and some links are independent of each other (the shared
// expert of the routed ones); on a GPU a branch runs such a chain on a second stream. The ops
// run() queues start after everything queued before the branch was opened and may run
// concurrently with what the caller queues after it, until join(); the caller's ops after join()
// see the branch's results. Neither side may write what the other reads or writes in between.
// Elsewhere (the CPU) run() runs its ops in place and join() does nothing: the same results, as
// each op's arithmetic does not depend on the stream it runs on. One branch open a thread at a
// time; a branch not joined is joined when it goes out of scope.
class ConcurrentBranch {
 public:
  explicit ConcurrentBranch(Device device);
  ~ConcurrentBranch();
  ConcurrentBranch(const ConcurrentBranch&) = delete;
  ConcurrentBranch& operator=(const ConcurrentBranch&) = delete;
  // Queues the ops `body` makes on the branch (once, at most, a branch).
  template <typename Body>
  void run(Body&& body) {
    enter();
    const Leave leave(*this);
    body();
  }
  void join();

 private:
  struct Leave {
    ConcurrentBranch& branch;
    explicit Leave(ConcurrentBranch& b) : branch(b) {}
    ~Leave() { branch.leave(); }
    Leave(const Leave&) = delete;
    Leave& operator=(const Leave&) = delete;
  };
  void enter();
  void leave() noexcept;
  bool open_ = false;  // a GPU branch (branches on, DEEPINFER_CONCURRENT_BRANCHES) not yet joined
};

}  // namespace deepinfer::ops
