// The CUDA backend's side of ops::ConcurrentBranch. No CUDA header is needed to include this file.
#pragma once

namespace deepinfer::cuda {

// ops::ConcurrentBranch on a GPU: a second stream of this thread and device beside the current
// one. open_branch makes it wait for everything queued so far on the current stream;
// enter_branch / leave_branch make it current and restore the stream it forked from;
// join_branch makes that stream wait for the branch's work. One branch open a thread at a time.
// branches_enabled: false under DEEPINFER_CONCURRENT_BRANCHES=0 (branches then run in place).
bool branches_enabled();
void open_branch();
void enter_branch();
void leave_branch() noexcept;
void join_branch();

}  // namespace deepinfer::cuda
